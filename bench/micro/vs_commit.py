#!/usr/bin/env python3
"""Public-API codec speed of this checkout against an older commit, in one run (a ratio).

    .venv/bin/python bench/micro/vs_commit.py 374d5bb                       # ORQ-9, BinGrad-pb, ORQ-5
    .venv/bin/python bench/micro/vs_commit.py 374d5bb --specs orq:levels=9 --n 16777216 --threads 1

A speed-up quoted against "today" must be measured against today's code on the same machine
at the same time: absolute times on a shared 2-core machine move with the load. This script
checks the older commit out into a git worktree (``/tmp/hvd_gradq_at_<commit>``, kept for the
next run, its numba cache warmed by a first untimed call), then times ``hvd_gradq.quantize`` +
``dequantize`` of the same standard-normal array in fresh processes that alternate between the
two trees (old, new, old, new, ...), and reports each tree's best and the ratio old / new.
``--threads`` is passed to the new tree's ``quantize``/``dequantize`` when given (the old one
has no such keyword: one thread). Load average printed before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One timing, run in a fresh interpreter with the tree under test first on sys.path.
_PROBE = r"""
import json, sys, time, inspect
import numpy as np
import hvd_gradq as gq
spec, n, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
kw = {}
if threads != "-" and "threads" in inspect.signature(gq.quantize).parameters:
    kw["threads"] = int(threads)
gq.dequantize(gq.quantize(x[: 1 << 12], spec, seed=1, **kw), **kw)  # compile / load the cache
best = float("inf")
for _ in range(reps):
    t = time.perf_counter()
    p = gq.quantize(x, spec, seed=1, **kw)
    gq.dequantize(p, **kw)
    best = min(best, time.perf_counter() - t)
print(json.dumps({"ms": best * 1e3, "file": gq.__file__}))
"""


def worktree(commit: str) -> Path:
    path = Path(f"/tmp/hvd_gradq_at_{commit}")
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(path), commit], check=True,
                       capture_output=True)
    return path


def probe(tree: Path, spec: str, n: int, reps: int, threads: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _PROBE, spec, str(n), str(reps), threads], env=env, cwd=str(tree),
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["file"].startswith(str(tree)), f"imported {got['file']}, not the tree {tree}"
    return float(got["ms"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commit", help="the older commit (today's code) to compare against")
    ap.add_argument("--specs", default="orq:levels=9,bingrad:variant=pb,orq:levels=5")
    ap.add_argument("--n", type=int, default=1 << 24, help="elements (default 16M: 64 MB)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls a process (best taken)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating process pairs a scheme")
    ap.add_argument("--threads", default="-", help="threads= for the new tree (default: its own default)")
    args = ap.parse_args()
    old = worktree(args.commit)
    print(f"load average before: {' / '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"| scheme | {args.commit} ms | this tree ms (threads {args.threads}) | speed-up |")
    print("|---|---:|---:|---:|")
    for spec in [s for s in args.specs.split(",") if s]:
        a, b = [], []
        for _ in range(args.rounds):
            a.append(probe(old, spec, args.n, args.reps, "-"))
            b.append(probe(ROOT, spec, args.n, args.reps, args.threads))
        print(f"| {spec} | {min(a):.1f} | {min(b):.1f} | {min(a) / min(b):.2f}x |", flush=True)
    print(f"load average after: {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
