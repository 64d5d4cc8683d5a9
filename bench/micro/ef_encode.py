"""What error feedback adds to an encode: the unfused chain (compensate, the input check and
encode, this rank's own decode, the residual: :class:`hvd_gradq.feedback.Memory`'s two compiled
passes around ``quantize``/``decode_flat``) against the one fused pass
(:func:`hvd_gradq.api.quantize_fed`), per scheme, at the MLP's largest tensor (1M elements) and
a small layer's (4,096), on one thread and on the rank's default threads. Reports ns an element,
each path as a multiple of a copy into a preallocated buffer timed in the same run, and the
ratio unfused / fused (best of several runs, wall clock). Also the encode alone (no error
feedback) as the floor. Writes results/micro/ef_encode.md.

    .venv/bin/python bench/micro/ef_encode.py                 # every scheme, 1 and 2 threads
    .venv/bin/python bench/micro/ef_encode.py --schemes bingrad --threads 1
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SCHEMES = ["sign", "uniform:bits=4", "qsgd:levels=4", "terngrad", "bingrad", "orq:levels=3", "orq:levels=5"]


def best_of(fn: Callable[[], Any], reps: int) -> float:
    """The best wall-clock ms of ``reps`` runs (after one untimed run: compiling, page faults)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def measure(x: np.ndarray, e: np.ndarray, spec: str, threads: int, reps: int) -> tuple[float, float, float]:
    """Best ms of the unfused chain, the one pass and the encode alone, for one scheme."""
    from hvd_gradq.api import decode_flat, quantize, quantize_fed
    from hvd_gradq.kernels import feedback as fused
    from hvd_gradq.spec import parse_scheme

    scheme = parse_scheme(spec)
    e_out = np.empty_like(x)

    def unfused() -> None:
        p = fused.compensate(x, e, None)
        fused.residual(p, decode_flat(quantize(p, scheme, seed=1, threads=threads), threads), None, None, e, e_out)

    def one_pass() -> None:
        quantize_fed(x, e, None, scheme, 1, e_out)

    def plain() -> None:
        quantize(x, scheme, seed=1, threads=threads)

    return best_of(unfused, reps), best_of(one_pass, reps), best_of(plain, reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--sizes", default="1048576,4096")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "results" / "micro" / "ef_encode.md"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    print(f"load average before: {' / '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs")
    for n in (int(s) for s in args.sizes.split(",")):
        x = rng.standard_normal(n).astype(np.float32)
        e = (0.1 * rng.standard_normal(n)).astype(np.float32)
        reps = args.reps * max(1, (1 << 20) // n // 64)
        copy_ms = best_of(partial(np.copyto, np.empty_like(x), x), reps)
        for spec in args.schemes.split(","):
            for th in args.threads:
                os.environ["HVD_GRADQ_THREADS"] = str(th)  # quantize_fed and the feedback passes read it
                u, f, p = measure(x, e, spec, th, reps)
                rows.append({"n": n, "scheme": spec, "threads": th, "unfused": u, "fused": f, "encode": p,
                             "copy": copy_ms})
                ns = 1e6 / n
                print(f"n={n} {spec} threads={th}: unfused {u * ns:.2f} ns/el ({u / copy_ms:.1f}x copy), fused "
                      f"{f * ns:.2f} ({f / copy_ms:.1f}x), encode alone {p * ns:.2f} ({p / copy_ms:.1f}x); "
                      f"unfused / fused {u / f:.2f}", flush=True)
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"load average after: {load}")
    lines = [
        "# Error feedback inside the encode: the unfused chain against the one pass",
        "",
        f"`.venv/bin/python bench/micro/ef_encode.py` (load average after: {load} on {os.cpu_count()} CPUs). "
        "Unfused: `feedback.compensate`, `quantize` (the input check and the encode), `decode_flat` (this "
        "rank's own values), `feedback.residual`, as `Memory` ran them a tensor before error feedback moved "
        "into the encoders. Fused: `api.quantize_fed`. Encode alone: `quantize` without error feedback, the "
        "floor. Best of several runs, wall clock; `x copy` is a multiple of a copy of the same tensor into a "
        "preallocated buffer in the same run.",
        "",
        "| elements | scheme | threads | unfused ns/el | x copy | fused ns/el | x copy | encode alone ns/el | "
        "unfused / fused |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ns = 1e6 / r["n"]
        lines.append(f"| {r['n']:,} | {r['scheme']} | {r['threads']} | {r['unfused'] * ns:.2f} | "
                     f"{r['unfused'] / r['copy']:.1f}x | {r['fused'] * ns:.2f} | {r['fused'] / r['copy']:.1f}x | "
                     f"{r['encode'] * ns:.2f} | {r['unfused'] / r['fused']:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
