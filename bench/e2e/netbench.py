#!/usr/bin/env python3
"""Run a Horovod script on emulated hosts with shaped links and report the bytes that crossed.

    netbench.py --hosts 4 --rate 100mbit [--delay-ms 0] -- worker.py --its args
    netbench.py --selftest [--hosts 4 --rate 100mbit --numel 4194304 --steps 3]
    netbench.py --check       # root, ip/tc, netem, leftovers
    netbench.py --cleanup     # remove what a killed run left behind

Needs root. Each rank runs on its own network namespace (see bench/netemu/); a ``.py``
script is started with this interpreter, with the repository on ``PYTHONPATH``, so
workers may call ``bench.netemu.phase("name")`` on every rank to get per-phase byte counts.

``--selftest`` runs a built-in worker: stock ``horovod.torch`` allreduce (Sum, no compression)
of a float32 tensor of ``--numel`` elements, ``--steps`` times, and compares the bytes each
host sent and received in that phase with the ring model 2(N-1)/N x bytes x steps, and the
step time with bytes / bandwidth. It exits 1 if a ratio is out of range.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench import netemu  # noqa: E402

RESULT_TOKEN = "NETBENCH_RESULT"
#: Bytes /proc/net/dev counts per full TCP segment on a 1500-MTU link (14 Ethernet + 20 IPv4 +
#: 32 TCP with timestamps + 1448 payload), over the payload: the header share of bulk transfers.
WIRE_FACTOR = 1514 / 1448


# --------------------------------------------------------------------------- selftest worker


def selftest_worker(numel: int, steps: int, idle_s: float) -> None:
    """One rank: warm up, idle, then ``steps`` timed allreduces; check the sums; print a result line."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    base = (torch.arange(numel, dtype=torch.int64) % 1000).to(torch.float32)
    x = base * float(rank + 1)
    expect = base * float(size * (size + 1) // 2)
    hvd.allreduce(x, op=hvd.Sum, name="netbench.warm")  # connections, buffers, response cache
    netemu.phase("warm")
    time.sleep(idle_s)  # Horovod's background negotiation only
    netemu.phase("idle")
    times: list[float] = []
    correct = True
    for _ in range(steps):
        t = time.perf_counter()
        y = hvd.allreduce(x, op=hvd.Sum, name="netbench.step")
        times.append(time.perf_counter() - t)
        correct = correct and bool(torch.equal(y, expect))
    netemu.phase("steps")
    res = {"rank": rank, "size": size, "numel": numel, "steps": steps, "times": times, "correct": correct}
    print(f"{RESULT_TOKEN} {json.dumps(res)}", flush=True)
    hvd.shutdown()


def parse_results(res: netemu.RunResult) -> dict[int, dict[str, Any]]:
    """The ``NETBENCH_RESULT`` JSON line of each rank that printed one."""
    out: dict[int, dict[str, Any]] = {}
    for r, text in enumerate(res.stdout):
        for line in text.splitlines():
            if line.startswith(RESULT_TOKEN + " "):
                out[r] = json.loads(line[len(RESULT_TOKEN) + 1 :])
    return out


def ring_bytes(n: int, nbytes: int) -> float:
    """Bytes one rank sends (and receives) in a ring allreduce of ``nbytes``."""
    return 2.0 * (n - 1) / n * nbytes


# --------------------------------------------------------------------------- reporting


def fmt_bytes(b: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= f:
            return f"{b / f:.3f} {unit}"
    return f"{b:.0f} B"


def print_bytes_table(res: netemu.RunResult, n: int) -> None:
    names = [m.name for m in res.phases]
    print(f"\nper-host bytes (from /proc/net/dev in each namespace; marks: {' -> '.join(names)})")
    print(f"{'segment':<22}{'t (s)':>8}" + "".join(f"{'h' + str(i) + ' sent':>14}{'h' + str(i) + ' recv':>14}"
                                               for i in range(n)))
    segs = [(names[j], names[j + 1]) for j in range(len(names) - 1)]
    if len(segs) > 1:
        segs.append(("start", "end"))
    for a, b in segs:
        sent, recv = res.phase_bytes(a, b)
        cells = "".join(f"{fmt_bytes(s):>14}{fmt_bytes(r):>14}" for s, r in zip(sent, recv))
        print(f"{a + '->' + b:<22}{res.seconds(a, b):>8.2f}{cells}")


def result_json(res: netemu.RunResult, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "hosts": args.hosts,
        "rate": args.rate,
        "rate_bps": res.rate_bps,
        "delay_ms": args.delay_ms,
        "offload": args.offload,
        "argv": res.argv,
        "returncodes": res.returncodes,
        "timed_out": res.timed_out,
        "error": res.error,
        "elapsed": res.elapsed,
        "marks": [
            {"name": m.name, "t": m.t, "bytes_sent": [c.bytes_sent for c in m.counters],
             "bytes_recv": [c.bytes_recv for c in m.counters], "packets_sent": [c.packets_sent for c in m.counters],
             "packets_recv": [c.packets_recv for c in m.counters],
             "tcp_retrans": [c.tcp_retrans for c in m.counters]}
            for m in res.phases
        ],
    }


# --------------------------------------------------------------------------- modes


def cluster(args: argparse.Namespace) -> netemu.EmulatedCluster:
    return netemu.EmulatedCluster(args.hosts, rate=args.rate, delay_ms=args.delay_ms, burst=args.burst,
                                  latency=args.latency, offload=args.offload)


def rank_env() -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }


def run_script(args: argparse.Namespace) -> int:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("netbench: nothing to run; usage: netbench.py --hosts N --rate R -- script.py args", file=sys.stderr)
        return 2
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    with cluster(args) as c:
        print(f"netbench: {c.n} hosts, {args.rate} each way per link, delay {args.delay_ms} ms; "
              f"running {' '.join(cmd)}", flush=True)
        res = c.run(cmd, env=rank_env(), timeout=args.timeout, cwd=os.getcwd(),
                    echo=None if args.quiet else sys.stdout)
    if args.quiet:
        for r, out in enumerate(res.outputs):
            print(f"--- rank {r} (exit {res.returncodes[r]}) ---\n{out}", end="")
    print_bytes_table(res, args.hosts)
    print(f"\nreturncodes {res.returncodes}, {res.elapsed:.1f} s" + (f"; {res.error}" if res.error else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result_json(res, args), indent=1))
    return 0 if res.ok else 1


def selftest(args: argparse.Namespace) -> int:
    n, numel, steps = args.hosts, args.numel, args.steps
    nbytes = numel * 4
    cmd = [sys.executable, str(Path(__file__).resolve()), "--selftest-worker", "--numel", str(numel),
           "--steps", str(steps), "--idle", str(args.idle)]
    with cluster(args) as c:
        print(f"netbench selftest: {n} hosts, {args.rate} each way, allreduce of {numel} float32 "
              f"({fmt_bytes(nbytes)}) x {steps} steps", flush=True)
        res = c.run(cmd, env=rank_env(), timeout=args.timeout, echo=None if args.quiet else sys.stderr)
    if not res.ok:
        print(res.summary(), file=sys.stderr)
        return 1
    print_bytes_table(res, n)
    results = parse_results(res)
    if sorted(results) != list(range(n)) or not all(r["correct"] for r in results.values()):
        print(f"FAIL: wrong allreduce result or missing ranks: {results}")
        return 1
    bw = res.rate_bps / 8.0  # bytes/s
    model = ring_bytes(n, nbytes) * steps
    sent, recv = res.phase_bytes("idle", "steps")
    t_steps = res.seconds("idle", "steps")
    idle_sent, idle_recv = res.phase_bytes("warm", "idle")
    idle_rate = max(idle_sent + idle_recv) / max(res.seconds("warm", "idle"), 1e-9)
    print(f"\nring model: 2(N-1)/N x {fmt_bytes(nbytes)} x {steps} = {fmt_bytes(model)} per host each way; "
          f"x {WIRE_FACTOR:.4f} for TCP/IP/Ethernet headers = {fmt_bytes(model * WIRE_FACTOR)}")
    print(f"background (idle phase, Horovod negotiation): up to {fmt_bytes(idle_rate)}/s per host per direction")
    worst = 0.0
    for h in range(n):
        rs, rr = sent[h] / model, recv[h] / model
        print(f"  h{h}: sent {fmt_bytes(sent[h])} ({rs:.4f} x model, {rs / WIRE_FACTOR:.4f} x model+headers), "
              f"recv {fmt_bytes(recv[h])} ({rr:.4f} x model, {rr / WIRE_FACTOR:.4f} x model+headers)")
        worst = max(worst, abs(rs - 1), abs(rr - 1))
    d = res.delta("idle", "steps")
    print(f"TCP retransmitted segments per host in the steps phase: {[c.tcp_retrans for c in d]}; "
          f"packets sent per host: {[c.packets_sent for c in d]}")
    per_step = [max(results[r]["times"][k] for r in results) for k in range(steps)]
    t_model = ring_bytes(n, nbytes) / bw
    t_wire = t_model * WIRE_FACTOR  # what tbf enforces: it charges every segment's headers
    t_meas_bytes = max(max(sent), max(recv)) / steps / bw
    mean = sum(per_step) / steps
    print(f"step time (slowest rank): {', '.join(f'{t:.3f}' for t in per_step)} s; "
          f"mean {mean:.3f} s; whole phase {t_steps / steps:.3f} s/step")
    print(f"  bytes/bandwidth: payload model {t_model:.3f} s, model+headers {t_wire:.3f} s, "
          f"measured bytes {t_meas_bytes:.3f} s")
    print(f"  mean step / (model+headers / bandwidth) = {mean / t_wire:.3f}; "
          f"mean step / (measured bytes / bandwidth) = {mean / t_meas_bytes:.3f}")
    load = os.getloadavg()[0]
    print(f"  context: load average {load:.1f} on {os.cpu_count()} CPUs (CPU contention lengthens steps)")
    ok_bytes = worst < 0.10
    ok_time = 0.95 <= mean / t_wire <= 1.6
    print(f"\nbytes within 10% of the ring model: {'PASS' if ok_bytes else 'FAIL'} (worst {worst * 100:.2f}%); "
          f"step time in [0.95, 1.6] x (model+headers)/bandwidth: {'PASS' if ok_time else 'FAIL'} "
          f"(below 0.95 would mean the shaping leaks; above, CPU-bound)")
    if args.json:
        out = result_json(res, args)
        out.update({"model_bytes": model, "step_times": per_step, "results": results})
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if ok_bytes and ok_time else 1


def check() -> int:
    try:
        ip, tc = netemu.preflight()
    except netemu.NetEmuError as e:
        print(f"netbench: {e}")
        return 1
    print(f"root: yes; ip: {ip}; tc: {tc}")
    print("netem (delay): " + ("available" if netemu.netem_available() else
                               "NOT available in this kernel (sch_netem missing): --delay-ms must be 0"))
    left = netemu.leftovers()
    print("leftovers: " + (", ".join(left) if left else "none"))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="100mbit", help="tc rate of each link, each way (default 100mbit)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added per host (needs netem)")
    ap.add_argument("--burst", default="256kb")
    ap.add_argument("--latency", default="100ms", help="tbf queue limit as a latency")
    ap.add_argument("--offload", action="store_true",
                    help="keep segmentation offload on the veths: less CPU, but counters miss ~4.4%% of headers")
    ap.add_argument("--timeout", type=float, default=900.0, help="kill all ranks after this many seconds")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--quiet", action="store_true", help="print ranks' output at the end, not live")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--selftest", action="store_true")
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--cleanup", action="store_true")
    mode.add_argument("--selftest-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--numel", type=int, default=4 * 1024 * 1024, help="selftest tensor size (float32)")
    ap.add_argument("--steps", type=int, default=3, help="selftest allreduces")
    ap.add_argument("--idle", type=float, default=1.0, help="selftest idle phase, seconds")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py args")
    args = ap.parse_args(argv)
    if args.selftest_worker:
        selftest_worker(args.numel, args.steps, args.idle)
        return 0
    try:
        if args.check:
            return check()
        if args.cleanup:
            removed = netemu.cleanup_leftovers()
            print("removed: " + (", ".join(removed) if removed else "nothing"))
            return 0
        if args.selftest:
            return selftest(args)
        return run_script(args)
    except netemu.NetEmuError as e:
        print(f"netbench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("netbench: interrupted; emulated hosts removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
