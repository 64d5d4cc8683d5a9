"""``python -m hvd_gradq``: check, advise, warm, calibrate (issue: day one).

The oracles here are independent of the code the commands call: wire bits from the payload
format's own definition (base-3 packing, 5 codes to a byte, plus levels and header), Horovod's
ring allreduce as 2(N-1)/N x bytes, and ``warm`` into an empty cache folder, whose second run
must compile nothing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hvd_gradq.cli import main, parser

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    cp = subprocess.run([sys.executable, "-m", "hvd_gradq", *args], capture_output=True, text=True, cwd=ROOT,
                        timeout=300, env=env)
    return cp.returncode, cp.stdout, cp.stderr


def test_every_command_has_help() -> None:
    rc, top, _ = cli("--help")
    assert rc == 0
    for cmd in ("check", "advise", "warm", "calibrate"):
        assert cmd in top
        sub = parser()._subparsers._group_actions[0].choices[cmd]  # type: ignore[union-attr]
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and len(action.help) > 10, (cmd, action.option_strings)
        rc, out, _ = cli(cmd, "--help")
        assert rc == 0 and "usage: python -m hvd_gradq " + cmd in out


def test_check_gives_canonical_spec_bits_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "orq:levels=3,bucket=512,ef=true", "--elements", "65536", "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    canonical = re.search(r"^canonical\s+(\S+)$", out, re.M).group(1)  # type: ignore[union-attr]
    assert canonical == "orq:levels=3,ef=true"  # only what differs from a default; the policy last
    named = re.search(r"^header\s+names '(\S+)'", out, re.M).group(1)  # type: ignore[union-attr]
    assert named == "orq:levels=3"  # the maths alone
    # ORQ-3's payload by the format's definition: a 22-byte fixed header, 8 bytes a dimension and
    # the scheme's spec text; 3 symbols packed 5 to a byte; 3 float32 levels for each bucket of 512
    n = 65536
    header = 22 + 8 * 1 + len("orq:levels=3")
    expect = header + -(-n // 5) + 3 * 4 * (n // 512)
    m = re.search(r"wire\s+([\d.]+) bits an element at 65,536 elements, header included \(([\d,]+) bytes; "
                  r"([\d.]+)x fewer than fp32\)", out)
    assert m, out
    assert int(m.group(2).replace(",", "")) == expect
    assert float(m.group(1)) == pytest.approx(8 * expect / n, abs=1e-4)
    assert float(m.group(3)) == pytest.approx(32 * n / (8 * expect), abs=0.01)
    assert re.search(r"summable\s+refused: .*Valid here: auto, gather, scatter, hierarchical", out), out
    assert re.search(r"scatter\s+ok", out) and re.search(r"gather\s+ok", out)
    assert re.search(r"^limit\s+finite \|x\| >= 1.7e\+38", out, re.M), out  # float32's largest, squared away


def test_check_takes_the_labels_advise_and_the_readme_print(capsys: pytest.CaptureFixture[str]) -> None:
    from hvd_gradq.cli.advise import CANDIDATES
    from hvd_gradq.spec import label_spec, parse

    for label, spec, _ in CANDIDATES:  # every label advise prints names the spec it ran
        assert label_spec(label) == spec, label
        assert main(["check", label]) == 0
        out = capsys.readouterr().out
        said = f"label       {label}: {spec}, as" if label.lower() != spec else f"spec        {spec}\n"  # TernGrad
        assert said in out, out
        assert re.search(rf"^canonical\s+{re.escape(parse(spec).spec)}$", out, re.M), out
    assert main(["check", "orq:levels=3,pattern=scatter,link_gbps=1"]) == 0  # HVD_GRADQ's line
    out = capsys.readouterr().out
    assert "spec        orq:levels=3\noptions     pattern=scatter, link_gbps=1: the compressor's" in out, out
    rc, _, err = cli("check", "ORQ-x")
    assert rc == 2 and "unknown scheme 'orq-x' (did you mean orq?)" in err, err


def test_check_a_bad_spec_exits_2_and_says_what_is_valid() -> None:
    rc, out, err = cli("check", "orq:levls=5")
    assert rc == 2 and "unknown parameter" in err and "levels" in err, err
    rc, _, err = cli("check", "orq", "--ranks", "1")
    assert rc == 2 and "--ranks" in err


def test_advise_25m_at_8_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--params", "25e6", "--ranks", "8", "--link-gbps", "1", "10"]) == 0
    out = capsys.readouterr().out
    n, ranks = 25_000_000, 8
    fp32_mb = 2 * (ranks - 1) / ranks * 4 * n / 1e6  # Horovod's ring allreduce, each way
    fp16_mb = fp32_mb / 2
    for gbps in (1, 10):
        m = re.search(rf"== {gbps} Gbit/s between hosts: Horovod fp32 allreduce moves ([\d,.]+) MB .* fp16 "
                      r"([\d,.]+) MB \(([\d,.]+) ms\)", out)
        assert m, out
        assert float(m.group(1).replace(",", "")) == pytest.approx(fp32_mb, rel=1e-3)
        assert float(m.group(2).replace(",", "")) == pytest.approx(fp16_mb, rel=1e-3)
        assert float(m.group(3).replace(",", "")) == pytest.approx(fp16_mb * 8e6 / (gbps * 1e9) * 1e3, rel=1e-3)
    recs = re.findall(r"recommendation at (\d+) Gbit/s: (.*)", out)
    assert [g for g, _ in recs] == ["1", "10"]
    for _, text in recs:  # a named scheme, or Horovod's fp16 with the reason
        assert "compression=" in text
    for label in ("ORQ-5", "BinGrad+EF", "uniform-4", "TernGrad"):
        assert re.search(rf"^{re.escape(label)}\s", out, re.M), label
    # BinGrad's payload: 1 bit an element plus two levels a bucket, so at least 25x below fp32
    row = re.search(r"^BinGrad\+EF\s+([\d,.]+)\s+([\d.]+)x", out, re.M)
    assert row and float(row.group(2)) > 25, row


def test_advise_reads_a_state_dict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1000, 500), torch.nn.Linear(500, 10))
    path = tmp_path / "model.pt"
    torch.save({"model": model.state_dict(), "step": 3}, path)
    assert main(["advise", "--state-dict", str(path), "--ranks", "4", "--link-gbps", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{sum(p.numel() for p in model.parameters()):,} parameters in 4 tensors" in out
    # BatchNorm's running statistics and an optimizer's momenta are in a checkpoint, but get no gradient
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()  # momentum buffers, one a parameter
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, path)
    assert main(["advise", "--state-dict", str(path), "--ranks", "4", "--link-gbps", "1"]) == 0
    out = capsys.readouterr().out
    params = list(net.parameters())
    assert (f"{sum(p.numel() for p in params):,} parameters in {len(params)} tensors of {path} (left out: 2 buffers "
            "(running_mean, running_var, num_batches_tracked); 6 tensors of an optimizer's state)") in out, out
    rc, _, err = cli("advise", "--state-dict", str(tmp_path / "missing.pt"), "--ranks", "4")
    assert rc == 2 and "missing.pt" in err
    rc, _, err = cli("advise", "--params", "1e6", "--ranks", "6", "--ranks-per-host", "4")
    assert rc == 2 and "--ranks-per-host must divide" in err


def test_warm_compiles_into_the_cache_folder_once(tmp_path: Path) -> None:
    # fp16 needs one kernel (the input scan): a cold compile that takes seconds, not minutes
    env = {**os.environ, "HVD_GRADQ_CACHE_DIR": str(tmp_path)}
    rc, out, err = cli("warm", "fp16", "none", env=env)
    assert rc == 0, err
    assert re.search(r"\[ 1/2\] fp16\s+[\d.]+ s  compiled 1 kernel\(s\)", out), out
    cached = list(tmp_path.rglob("*.nbi"))
    # the scan, and error feedback's two passes with the subnormal flush they call (warm runs
    # them whatever the schemes)
    assert cached and re.search(rf"cache: {re.escape(str(cached[0].parent))} \(4 kernel\(s\) cached\)", out), out
    rc, out, err = cli("warm", "fp16", "none", env=env)
    assert rc == 0, err
    assert re.search(r"warm: 2 schemes in [\d.]+ s, 0 kernel\(s\) compiled", out), out
    assert out.count("from the cache") == 2
    rc, _, err = cli("warm", "orq:levls=3", env=env)
    assert rc == 2 and "levels" in err


def test_calibrate_out_is_what_advise_and_jobs_price_with(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from hvd_gradq.frontend import probe
    from hvd_gradq.plan import cpu_cost
    from hvd_gradq.spec import parse_scheme

    monkeypatch.delenv(cpu_cost.TABLE_ENV, raising=False)
    mine = tmp_path / "cpu.json"
    assert main(["calibrate", "--elements", "4096", "--reps", "1", "orq:levels=5", "--out", str(mine)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {mine}: `python -m hvd_gradq advise --cpu-table {mine} ...`" in out, out
    body = json.loads(mine.read_text())
    assert body["format"] == cpu_cost.FORMAT and set(body["ns_per_element"]) == {"orq:5"}
    # a table of a machine 1000x slower at ORQ-5: advise prices with it and says so
    body["ns_per_element"]["orq:5"] = [20000.0, 1000.0]
    mine.write_text(json.dumps(body))
    try:
        assert main(["advise", "--params", "25e6", "--ranks", "8", "--link-gbps", "1", "--cpu-table", str(mine)]) == 0
        slow = capsys.readouterr().out
        assert f"(CPU: {mine}, one core a rank)" in slow, slow
        orq5 = float(re.search(r"^ORQ-5\s+[\d,.]+\s+[\d.]+x\s+([\d,.]+)", slow, re.M).group(1).replace(",", ""))  # type: ignore[union-attr]
        assert orq5 > 25e6 * 20000 * 1e-9 * 1e3, slow  # ms: at least its own encode at the file's figure
        assert cpu_cost.ns_per_element(parse_scheme("orq:levels=3")) == cpu_cost.NS_PER_ELEMENT["orq:3"]  # kept
    finally:
        cpu_cost.use_table(None)
    assert cpu_cost.table() is cpu_cost.SHIPPED
    assert main(["advise", "--params", "25e6", "--ranks", "8", "--link-gbps", "1"]) == 0
    assert "(CPU: the shipped table" in capsys.readouterr().out
    # a job: HVD_GRADQ_CPU_TABLE prices its decisions with the file, without timing at start-up
    monkeypatch.setenv(cpu_cost.TABLE_ENV, str(mine))
    assert probe.figures_source() == "table"
    got = probe.agreed(parse_scheme("orq:levels=5"), 2, 1, lambda x: x, lambda row: row.reshape(1, -1))
    assert got.get("orq") == (20000.0, 1000.0)
    monkeypatch.delenv(cpu_cost.TABLE_ENV)
    assert cpu_cost.table() is cpu_cost.SHIPPED
    # what is not a table is refused, naming the file
    for text, why in (("{", "not JSON"), ('{"format": "x"}', "its format is not"),
                      (json.dumps({**body, "ns_per_element": {"orq:5": [1]}}), r"orq:5: \[1\] is not \[encode")):
        mine.write_text(text)
        rc, _, err = cli("advise", "--params", "1e6", "--ranks", "2", "--cpu-table", str(mine))
        assert rc == 2 and re.search(rf"{re.escape(str(mine))}: not a CPU table written by .*calibrate --out.*{why}",
                                     err), err


def test_calibrate_times_the_codec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "table.py"
    assert main(["calibrate", "--elements", "8192", "--reps", "1", "orq:levels=5", "uniform:bits=4",
                 "--write", str(table)]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(orq:levels=5|uniform:bits=4)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["orq:levels=5", "uniform:bits=4"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    written: dict[str, object] = {}
    exec(table.read_text(), written)  # the cost model's module form: a dict by table key
    got = written["NS_PER_ELEMENT"]
    assert isinstance(got, dict) and set(got) == {"orq:5", "uniform:4"}
    assert got["orq:5"] == pytest.approx((float(rows[0][1]), float(rows[0][2])), abs=0.006)
    assert main(["calibrate", "nosuchscheme"]) == 2
