#!/usr/bin/env python3
"""Every scheme's device codec (``codec=device``) timed on a CUDA device, in one bounded run.

    .venv/bin/python bench/micro/bench_gpu.py                      # cuda, 2**24 elements, under ~4 minutes
    .venv/bin/python bench/micro/bench_gpu.py --device cpu --n 20000 --budget 30   # smoke run of the script itself

For each spec (every registered scheme at its defaults, plus the flagship variants) on one
float32 tensor of ``--n`` Student-t(3) values already on the device:

* ``math``: the scheme's encode + decode through :class:`hvd_gradq.torch.ops.TorchOps` (what
  :mod:`hvd_gradq.torch.device` runs), nothing leaving the device except what a scheme's own
  ``Ops.host`` search takes (the ``host`` column counts those calls an encode: ORQ with 6 or more
  levels and BinGrad-pb; ORQ-4/5 search on the device, :mod:`hvd_gradq.torch.device_levels`);
* ``codec``: :func:`hvd_gradq.torch.device.encode` (the above plus copying the packed sections
  to the host and framing the payload, as a training step does).

Columns: ns an element and GB/s of float32 input (4 bytes an element), both for the best of the
repetitions, and the math's speed as a share of a device-to-device copy of the same tensor
(``dst.copy_(src)``, timed in the same run). Times are wall clock around
``torch.cuda.synchronize()``. ``--budget`` seconds (default 240) bounds the whole run: each spec
gets at most ``--reps`` repetitions and at most its share of what is left, and specs that no
longer fit are listed as skipped rather than timed. Exits with status 2 and a message when the
device asked for is not there (no CUDA device, or torch built without CUDA).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hvd_gradq.spec import names, parse_scheme  # noqa: E402
from hvd_gradq.torch import device as dev_codec  # noqa: E402
from hvd_gradq.torch.ops import TorchOps  # noqa: E402

#: The flagship variants beside each registered scheme's defaults.
EXTRA = ["uniform:bits=4", "qsgd:levels=4", "bingrad:variant=pb", "orq:levels=3", "orq:levels=4",
         "orq:levels=9", "orq:levels=5,scales=fp16"]


def specs() -> list[str]:
    out = [f"{n}" for n in names()]
    return out + [s for s in EXTRA if s not in out]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn: Callable[[], Any], device: torch.device, reps: int, until: float) -> tuple[float, int]:
    """Best wall time (s) of ``fn`` over up to ``reps`` runs after one warm-up, stopping at ``until``."""
    fn()
    sync(device)
    best, done = float("inf"), 0
    while done < reps and (done == 0 or time.perf_counter() < until):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
        done += 1
    return best, done


def host_calls(spec: str, x: torch.Tensor) -> int:
    """How many ``Ops.host`` searches one encode of ``spec`` makes (0: all on the device)."""
    calls = [0]
    real = TorchOps.host

    def counted(self: TorchOps, fn: Any, v: Any, shape: tuple[int, ...]) -> Any:
        calls[0] += 1
        return real(self, fn, v, shape)

    TorchOps.host = counted  # type: ignore[method-assign,assignment]
    try:
        parse_scheme(spec).encode(TorchOps(x.device), x, 1)
    finally:
        TorchOps.host = real  # type: ignore[method-assign]
    return calls[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a smoke run")
    ap.add_argument("--n", type=int, default=1 << 24, help="elements of the tensor (default 2**24, 64 MB)")
    ap.add_argument("--reps", type=int, default=10, help="repetitions a spec at most (best is reported)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the whole run (default 240)")
    ap.add_argument("--schemes", nargs="*", help="specs to time (default: every scheme and the flagship variants)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    start = time.perf_counter()
    deadline = start + args.budget
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"bench_gpu: no CUDA device here (torch {torch.__version__}, cuda build: {torch.version.cuda}); "
              "run it on a GPU machine, or pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_t(3, args.n).astype(np.float32)).to(device)
    dst = torch.empty_like(x)
    copy_s, _ = best_of(lambda: dst.copy_(x), device, 20, deadline)
    todo = args.schemes or specs()
    print(f"# device codec on {where}: n = {args.n:,} float32, torch {torch.__version__}, "
          f"copy {copy_s * 1e3:.3f} ms ({4 * args.n / copy_s / 1e9:.1f} GB/s)\n")
    print("| spec | host searches | math ns/elem | math GB/s | % of copy | codec ns/elem | codec GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows: list[dict[str, Any]] = []
    for k, spec in enumerate(todo):
        left = deadline - time.perf_counter()
        share = left / (len(todo) - k)
        if left <= 0:
            print(f"| {spec} | skipped: the {args.budget:.0f} s budget is spent | | | | | |")
            continue
        scheme = parse_scheme(spec)
        ops = TorchOps(device)

        def math() -> None:
            parts = scheme.encode(ops, x, 7)  # noqa: B023
            scheme.decode(ops, parts, args.n)  # noqa: B023

        until = time.perf_counter() + share / 2
        m_s, m_reps = best_of(math, device, args.reps, until)
        c_s, c_reps = best_of(lambda: dev_codec.encode(scheme, x, 7), device, args.reps,  # noqa: B023
                              time.perf_counter() + share / 2)
        row = {"spec": spec, "host_searches": host_calls(spec, x), "math_ns": m_s / args.n * 1e9,
               "math_gbs": 4 * args.n / m_s / 1e9, "pct_copy": copy_s / m_s * 100, "codec_ns": c_s / args.n * 1e9,
               "codec_gbs": 4 * args.n / c_s / 1e9, "reps": [m_reps, c_reps]}
        rows.append(row)
        print(f"| {spec} | {row['host_searches']} | {row['math_ns']:.3f} | {row['math_gbs']:.2f} | "
              f"{row['pct_copy']:.1f} | {row['codec_ns']:.3f} | {row['codec_gbs']:.2f} |", flush=True)
    print(f"\n{time.perf_counter() - start:.1f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "n": args.n, "copy_s": copy_s, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
