"""``python -m hvd_gradq``: check, advise, warm, calibrate (issue: day one).

The oracles here are independent of the code the commands call: wire bits from the payload
format's own definition (base-3 packing, 5 codes to a byte, plus levels and header), Horovod's
ring allreduce as 2(N-1)/N x bytes, and a second run of ``warm`` that must compile nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hvd_gradq.cli import main, parser

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> tuple[int, str, str]:
    cp = subprocess.run([sys.executable, "-m", "hvd_gradq", *args], capture_output=True, text=True, cwd=ROOT,
                        timeout=300)
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
    assert main(["check", "orq:levels=3", "--elements", "65536", "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    assert "canonical   orq:bucket=512,ef=false" in out and "levels=3" in out
    # ORQ-3 on the wire: 3 codes packed 5 to a byte (1.6 bits), 3 float32 levels a bucket of 512
    # (0.1875 bits), plus one header: between those and a few hundred bytes above
    bits = float(re.search(r"wire\s+([\d.]+) bits an element", out).group(1))  # type: ignore[union-attr]
    n, buckets = 65536, 65536 // 512
    floor = (-(-n // 5) + 3 * 4 * buckets) * 8 / n
    assert floor <= bits <= floor + 8 * 512 / n, (bits, floor)
    assert re.search(r"summable\s+refused: .*Valid here: auto, gather, scatter, hierarchical", out), out
    assert re.search(r"scatter\s+ok", out) and re.search(r"gather\s+ok", out)


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
    rc, _, err = cli("advise", "--state-dict", str(tmp_path / "missing.pt"), "--ranks", "4")
    assert rc == 2 and "missing.pt" in err
    rc, _, err = cli("advise", "--params", "1e6", "--ranks", "6", "--ranks-per-host", "4")
    assert rc == 2 and "--ranks-per-host must divide" in err


def test_warm_twice_compiles_nothing_the_second_time() -> None:
    rc, out, err = cli("warm", "--quiet")
    assert rc == 0, err
    rc, out, err = cli("warm")
    assert rc == 0, err
    assert re.search(r"warm: 16 schemes in [\d.]+ s, 0 kernel\(s\) compiled; cache: \S", out), out
    assert out.count("from the cache") == 16


def test_calibrate_times_the_codec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--elements", "8192", "--reps", "1", "orq:levels=5", "uniform:bits=4"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(orq:levels=5|uniform:bits=4)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["orq:levels=5", "uniform:bits=4"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert main(["calibrate", "nosuchscheme"]) == 2
