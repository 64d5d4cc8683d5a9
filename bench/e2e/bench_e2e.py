#!/usr/bin/env python3
"""End-to-end benchmark on emulated hosts: every scheme against Horovod's and DDP's own compression.

    sudo .venv/bin/python bench/e2e/bench_e2e.py                 # 4 hosts, 100mbit and 1gbit
    .venv/bin/python bench/e2e/bench_e2e.py --rates 1gbit --steps 2 --schemes ORQ-5,none   # quicker

Builds N hosts as network namespaces with shaped links (``bench/netemu/``, root only),
starts one rank per host, and in ONE launch per bandwidth trains the same MLP (MNIST-1D input,
three hidden layers of 2304: 10.7M parameters, 41 MB of fp32 gradients) with each scheme in turn:
``--warmup`` untimed steps, then ``--steps`` timed ones between two phase marks, at which the
launcher reads every host's kernel byte counters. Per scheme it reports the step time (slowest
rank, mean over the timed steps), the bytes that crossed each host's link per step, and for the
hvd_gradq schemes the bytes ``stats()`` says the rank sent, with the ratio of the two. The peers
run in the same launch: Horovod's ``Compression.fp16``, and ``DistributedDataParallel`` over Gloo
with ``fp16_compress_hook`` and ``powerSGD_hook`` (rank 4), plus uncompressed baselines of both.

``--tta`` adds time to a target test accuracy: the same model trained on MNIST-1D with each
scheme (Adam), evaluated every ``--tta-every`` steps, until ``--tta-target`` or ``--tta-steps``.
The worker (one rank) is in ``e2e_worker.py``, the tables and the plot in ``e2e_report.py``.
Writes ``results/e2e/e2e.md``, ``results/e2e/e2e_step_time.png`` and ``results/raw/e2e.json`` (named after ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench import netemu  # noqa: E402
from bench.e2e.e2e_report import plot, report  # noqa: E402
from bench.e2e.e2e_worker import DONE, ENTRIES, HEADER_BYTES, TOKEN, TTA_DEFAULT, worker  # noqa: E402

# ============================================================================== launcher


def _parse_worker_out(res: netemu.RunResult) -> list[dict[str, Any]]:
    outs = []
    for text in res.stdout:
        for line in text.splitlines():
            if line.startswith(TOKEN + " "):
                outs.append(json.loads(line[len(TOKEN) + 1 :]))
    return outs


class _Progress:
    """An ``echo`` sink for the cluster run: advances a bar on rank 0's per-scheme lines and keeps
    everything else for the log."""

    def __init__(self, bar: Any, log: Any) -> None:
        self.bar, self.log = bar, log

    def write(self, s: str) -> int:
        self.log.write(s)
        if s.startswith(f"[h0] {DONE} "):
            self.bar.set_postfix_str(s.split(DONE, 1)[1].strip()[:30])
            self.bar.update(1)
        return len(s)

    def flush(self) -> None:
        self.log.flush()


def _payload(c: netemu.HostCounters) -> int:
    """TCP payload bytes a host sent: its link's bytes less the headers of every packet."""
    return c.bytes_sent - HEADER_BYTES * c.packets_sent


def run_rate(args: argparse.Namespace, rate: str, bar: Any, log: Any) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(args.batch), "--seed", str(args.seed), "--lr", str(args.lr),
            "--idle", str(args.idle),
            "--schemes", ",".join(args.labels), "--tta-schemes", ",".join(args.tta_labels),
            "--tta-target", str(args.tta_target), "--tta-steps", str(args.tta_steps),
            "--tta-every", str(args.tta_every), "--tta-seeds", str(args.tta_seeds)]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HVD_GRADQ_CACHE": os.environ.get("HVD_GRADQ_CACHE", str(Path.home() / ".cache" / "hvd_gradq"))}
    cpus = [str(i) for i in range(args.hosts)] if args.pin else None
    with netemu.EmulatedCluster(args.hosts, rate=rate) as c:
        # auto's cost model (and its fp16 fallback) told the link rate, as a user would
        env["HVD_GRADQ_LINK_GBPS"] = f"{c.rate_bps / 1e9:g}"
        res = c.run(argv, env=env, timeout=args.timeout, cwd=str(ROOT), echo=_Progress(bar, log), cpus=cpus)
    if not res.ok:
        raise SystemExit(f"bench_e2e: the run at {rate} failed: {res.error}\n{res.summary()}")
    outs = {o["rank"]: o for o in _parse_worker_out(res)}
    if sorted(outs) != list(range(args.hosts)):
        raise SystemExit(f"bench_e2e: ranks {sorted(outs)} reported, expected {args.hosts}\n{res.summary()}")
    entries = [e for e in ENTRIES if e.label in args.labels]
    idle = res.delta("idle.a", "idle.b")
    idle_s = res.seconds("idle.a", "idle.b")
    chatter = [_payload(c) / idle_s for c in idle]  # payload B/s per host
    rows: dict[str, Any] = {}
    for i, e in enumerate(entries):
        steps = args.steps
        per_step = [max(outs[r]["schemes"][e.label]["times"][k] for r in outs) for k in range(steps)]
        d = res.delta(f"s{i}.a", f"s{i}.b")
        t = res.seconds(f"s{i}.a", f"s{i}.b")
        row: dict[str, Any] = {
            "step_s": sum(per_step) / steps, "step_times": per_step, "phase_s": t,
            "wire_sent": [c.bytes_sent / steps for c in d], "wire_recv": [c.bytes_recv / steps for c in d],
            "payload_sent": [_payload(c) / steps for c in d],
            "retrans": [c.tcp_retrans for c in d],
        }
        if e.kind == "gradq":
            row["stats_sent"] = [outs[r]["schemes"][e.label]["stats_sent"] / steps for r in range(args.hosts)]
            row["stats_received"] = [outs[r]["schemes"][e.label]["stats_received"] / steps for r in range(args.hosts)]
        if "tta" in outs[0]["schemes"][e.label]:
            row["tta"] = outs[0]["schemes"][e.label]["tta"]
        rows[e.label] = row
    return {"rate": rate, "rate_bps": res.rate_bps, "params": outs[0]["params"], "chatter_Bps": chatter,
            "compute_s": max(o["compute_s"] for o in outs.values()), "schemes": rows,
            "load": os.getloadavg(), "pinned": bool(args.pin)}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--steps", type=int, default=3, help="timed steps a scheme")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (PowerSGD starts at step 2)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of the idle phase (background traffic)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--schemes", default="", help="comma-separated labels (default: all): " +
                    ", ".join(e.label for e in ENTRIES).replace("%", "%%"))  # argparse formats help with %
    ap.add_argument("--tta", action="store_true", help="also measure time to --tta-target accuracy")
    ap.add_argument("--tta-rates", default="1gbit", help="bandwidths at which --tta runs")
    ap.add_argument("--tta-schemes", default="", help="labels for --tta (default: a representative subset)")
    ap.add_argument("--tta-target", type=float, default=0.5)
    ap.add_argument("--tta-steps", type=int, default=150)
    ap.add_argument("--tta-every", type=int, default=10)
    ap.add_argument("--tta-seeds", type=int, default=1, help="fresh models a scheme for --tta (seeds --seed+1 ...)")
    ap.add_argument("--pin", action="store_true",
                    help="pin host i's rank to CPU i (taskset): hosts that share no CPU time (at most one per core)")
    ap.add_argument("--timeout", type=float, default=3000.0)
    ap.add_argument("--out", default=str(ROOT / "results" / "e2e" / "e2e.md"))
    ap.add_argument("--from-json", default="", help="only rewrite the report from this raw results file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    known = [e.label for e in ENTRIES]
    args.labels = [s.strip() for s in args.schemes.split(",") if s.strip()] or known
    tta = [s.strip() for s in args.tta_schemes.split(",") if s.strip()]
    if args.worker:
        args.tta_labels = tta
        worker(args)
        return 0
    args.tta_labels = (tta or [lab for lab in TTA_DEFAULT if lab in args.labels]) if args.tta else []
    bad = [s for s in args.labels + args.tta_labels if s not in known]
    if bad:
        print(f"bench_e2e: unknown scheme label(s) {bad}; valid: {known}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.hosts < 2:
        print("bench_e2e: --steps must be >= 1 and --hosts >= 2", file=sys.stderr)
        return 2
    if args.pin and args.hosts > (os.cpu_count() or 1):
        print(f"bench_e2e: --pin needs a core a host; {args.hosts} hosts, {os.cpu_count()} cores", file=sys.stderr)
        return 2
    if args.from_json:  # regenerate the table and plot from an earlier run's raw results
        runs = json.loads(Path(args.from_json).read_text())
        return _write(runs, args, argv)
    try:
        netemu.preflight()
    except netemu.NetEmuError as e:
        print(f"bench_e2e: {e}", file=sys.stderr)
        return 1
    from tqdm import tqdm

    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    tta_rates = {r.strip() for r in args.tta_rates.split(",")}
    raw = ROOT / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    runs = []
    t0 = time.monotonic()
    with open(raw / "e2e.log", "w") as log, tqdm(total=len(rates) * len(args.labels), desc="bench_e2e",
                                                 unit="scheme") as bar:
        for rate in rates:
            a = argparse.Namespace(**vars(args))
            if rate not in tta_rates:
                a.tta_labels = []
            bar.set_description(f"bench_e2e {rate}")
            runs.append(run_rate(a, rate, bar, log))
            raw_json(Path(args.out)).write_text(json.dumps(runs, indent=1))
    print(f"bench_e2e: measured in {time.monotonic() - t0:.0f} s")
    return _write(runs, args, argv)


def figure(out: Path) -> Path:
    """The plot beside a report: ``e2e.md`` -> ``e2e_step_time.png``."""
    return out.with_name(f"{out.stem}_step_time.png")


def raw_json(out: Path) -> Path:
    """The raw results of a report: ``results/e2e/e2e.md`` -> ``results/raw/e2e.json``."""
    return ROOT / "results" / "raw" / f"{out.stem}.json"


def _write(runs: list[dict[str, Any]], args: argparse.Namespace, argv: Optional[list[str]]) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    words = [w for i, w in enumerate(given)
             if not w.startswith("--from-json") and (i == 0 or given[i - 1] != "--from-json")]
    cmd = "sudo .venv/bin/python bench/e2e/bench_e2e.py " + shlex.join(words)  # runs as printed: names have spaces
    out = Path(args.out)
    text = report(runs, args, cmd, figure(out).name)
    out.write_text(text)
    plot(runs, figure(out))
    print(text)
    print(f"bench_e2e: wrote {out} and {figure(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
