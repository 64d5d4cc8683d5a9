"""Time quantize + dequantize of 64 MB of float32 (16M elements, buckets of 512) per scheme on
ONE thread, as a share of a plain 64 MB copy into a preallocated buffer timed in the same run,
through the public API (``hvd_gradq.quantize``/``dequantize``), the compiled kernels alone
(``hvd_gradq.kernels``, preallocated output buffers) and the NumPy reference; also decoding and
summing 3 payloads, and torch's own ``quantize_per_tensor``. Writes results/kernels.md and
results/raw/kernels.json.

    .venv/bin/python bench/bench_kernels.py            # everything (the reference takes minutes)
    .venv/bin/python bench/bench_kernels.py --no-ref   # the fast path only

"% of copy" is copy_ms / total_ms * 100 (the bandwidth of quantize+dequantize as a share of a
memcpy's); issue 13's targets: uniform, sign >= 30%; qsgd, terngrad >= 20%; orq, bingrad >= 10%
(at the exact optimum); decode+sum of 3 payloads >= 25% of a copy of the same elements. Every
figure is the best of several runs (wall clock), as is the copy's.
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hvd_gradq import kernels  # noqa: E402
from hvd_gradq.spec import parse  # noqa: E402
from hvd_gradq.xp import NUMPY  # noqa: E402

# (spec, target %): issue 13's targets for quantize+dequantize through the public API, as a share
# of a copy (ORQ and BinGrad at the exact optimum)
SCHEMES: list[tuple[str, float]] = [
    ("uniform:bits=8", 30.0),
    ("uniform:bits=4", 30.0),
    ("sign", 30.0),
    ("qsgd:levels=4", 20.0),
    ("qsgd:levels=1", 20.0),
    ("terngrad", 20.0),
    ("bingrad", 10.0),
    ("bingrad:variant=pb", 10.0),
    ("orq:levels=3", 10.0),
    ("orq:levels=5", 10.0),
    ("orq:levels=9", 10.0),
]
SUM_TARGET = 25.0  # decoding and summing N-1 = 3 payloads, as a share of a copy of the same elements


def best_of(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(best wall-clock ms, best thread-CPU ms) over ``reps`` runs."""
    wall = cpu = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        c1, t1 = time.thread_time(), time.perf_counter()
        wall, cpu = min(wall, (t1 - t0) * 1e3), min(cpu, (c1 - c0) * 1e3)
    return wall, cpu


def fast_path(spec: str, x: np.ndarray, reps: int) -> dict[str, float] | None:
    scheme = parse(spec)
    n = x.size
    sec = {s.name: s for s in scheme.sections(n)}
    out = {"meta": np.empty(sec["meta"].count, np.float32), "codes": np.empty(sec["codes"].count, np.uint8)}
    parts = kernels.encode(scheme, x, 1, out=out)  # compiles (or loads the cache), touches the buffers
    if parts is None:
        return None
    dst = np.empty(n, np.float32)
    kernels.decode(scheme, parts, n, out=dst)
    enc = best_of(lambda: kernels.encode(scheme, x, 1, out=out), reps)
    dec = best_of(lambda: kernels.decode(scheme, parts, n, out=dst), reps)
    return {"encode_ms": enc[0], "decode_ms": dec[0], "encode_cpu_ms": enc[1], "decode_cpu_ms": dec[1]}


def public_api(spec: str, x: np.ndarray, reps: int) -> dict[str, float]:
    """``hvd_gradq.quantize`` + ``dequantize`` (what a user calls: input checks, the kernels, the
    payload's header and checksum, parsing it back), and decoding + summing 3 payloads."""
    import hvd_gradq

    scheme = parse(spec)
    p = hvd_gradq.quantize(x, scheme, seed=1)
    hvd_gradq.dequantize(p)
    enc = best_of(lambda: hvd_gradq.quantize(x, scheme, seed=1), reps)
    dec = best_of(lambda: hvd_gradq.dequantize(p), reps)
    three = [hvd_gradq.quantize(x, scheme, seed=k) for k in (2, 3, 4)]
    acc = np.empty_like(x)

    def sum3() -> None:
        kernels.decode(scheme, three[0].parts, x.size, out=acc)
        for q in three[1:]:
            np.add(acc, hvd_gradq.api.decode_flat(q), out=acc)

    s3 = best_of(sum3, reps) if kernels.kernel(scheme) is not None else (float("nan"), float("nan"))
    return {"encode_ms": enc[0], "decode_ms": dec[0], "encode_cpu_ms": enc[1], "decode_cpu_ms": dec[1],
            "sum3_ms": s3[0], "sum3_cpu_ms": s3[1]}


def torch_native(x: np.ndarray, reps: int) -> dict[str, float] | None:
    """torch's own ``quantize_per_tensor`` (quint8) + ``dequantize``, one thread."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    t = torch.from_numpy(x)
    lo, hi = float(t.min()), float(t.max())
    scale = (hi - lo) / 255.0
    zp = round(-lo / scale)
    q = torch.quantize_per_tensor(t, scale, zp, torch.quint8)
    enc = best_of(lambda: torch.quantize_per_tensor(t, scale, zp, torch.quint8), reps)
    dec = best_of(lambda: q.dequantize(), reps)
    return {"encode_ms": enc[0], "decode_ms": dec[0], "encode_cpu_ms": enc[1], "decode_cpu_ms": dec[1]}


def reference(spec: str, x: np.ndarray, reps: int) -> dict[str, float]:
    scheme = parse(spec)
    holder: dict[str, Any] = {}

    def enc() -> None:
        holder["parts"] = scheme.encode(NUMPY, x, 1)

    e = best_of(enc, reps)
    parts = {k: np.asarray(v) for k, v in holder["parts"].items()}
    d = best_of(lambda: scheme.decode(NUMPY, parts, x.size), reps)
    return {"encode_ms": e[0], "decode_ms": d[0], "encode_cpu_ms": e[1], "decode_cpu_ms": d[1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1 << 24, help="float32 elements (default 16M = 64 MB)")
    ap.add_argument("--reps", type=int, default=9, help="runs of each fast-path timing (best kept)")
    ap.add_argument("--ref-reps", type=int, default=1, help="runs of each reference timing")
    ap.add_argument("--no-ref", action="store_true", help="skip the (slow) NumPy reference")
    ap.add_argument("--schemes", nargs="*", help="specs to time (default: the issue's list)")
    ap.add_argument("--out", default=str(ROOT / "results" / "kernels.md"))
    ap.add_argument("--raw", default=str(ROOT / "results" / "raw" / "kernels.json"), help="where the JSON goes")
    args = ap.parse_args()

    n = args.elements
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dst = np.empty_like(x)
    np.copyto(dst, x)
    copy_ms, copy_cpu = best_of(lambda: np.copyto(dst, x), max(15, args.reps))
    print(f"copy of {x.nbytes / 2**20:.0f} MB into a preallocated buffer: {copy_ms:.2f} ms "
          f"({x.nbytes / copy_ms / 1e6:.1f} GB/s)", flush=True)
    targets = dict(SCHEMES)
    specs = args.schemes or [s for s, _ in SCHEMES]
    rows: list[dict[str, Any]] = []
    for spec in specs:
        target = targets.get(spec, 20.0 if parse(spec).name in ("uniform", "qsgd", "terngrad", "sign") else 10.0)
        paths: list[tuple[str, dict[str, float] | None]] = []
        if kernels.available():
            paths.append(("public API", public_api(spec, x, args.reps)))
            paths.append(("kernels only", fast_path(spec, x, args.reps)))
        if not args.no_ref:
            paths.append(("reference (NumPy)", reference(spec, x, args.ref_reps)))
        for path, r in paths:
            row: dict[str, Any] = {"scheme": spec, "path": path, "target_pct": target}
            if r is None:
                row["note"] = "no fast path for this scheme (the reference runs instead)"
            else:
                total = r["encode_ms"] + r["decode_ms"]
                row.update(r, total_ms=total, pct_of_copy=copy_ms / total * 100.0)
                row["met"] = row["pct_of_copy"] >= target
            rows.append(row)
            if "total_ms" in row:
                print(f"{spec:22s} {path:18s} enc {row['encode_ms']:9.1f}  dec {row['decode_ms']:8.1f}  "
                      f"total {row['total_ms']:9.1f} ms  {row['pct_of_copy']:6.2f}% of copy "
                      f"(target {target:.0f}%: {'met' if row['met'] else 'NOT met'})", flush=True)
            else:
                print(f"{spec:22s} {path:18s} {row['note']}", flush=True)

    nat = torch_native(x, args.reps)
    if nat is not None:
        total = nat["encode_ms"] + nat["decode_ms"]
        rows.append({"scheme": "torch quantize_per_tensor (quint8)", "path": "torch native", "target_pct": 0.0,
                     **nat, "total_ms": total, "pct_of_copy": copy_ms / total * 100.0, "met": True})
        print(f"torch quantize_per_tensor+dequantize: {copy_ms / total * 100.0:.2f}% of copy", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    lines = [
        f"# Kernel throughput: quantize + dequantize of {x.nbytes / 2**20:.0f} MB of float32",
        "",
        f"{n} float32 elements ({x.nbytes / 2**20:.0f} MB, standard normal), buckets of 512, ONE thread "
        "(NUMBA_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=1). Baseline: `np.copyto(dst, src)` into a "
        f"preallocated buffer, best of {max(15, args.reps)} in the same run. % of copy = copy_ms / total_ms "
        f"* 100. Best of {args.reps} runs (fast path) and {args.ref_reps} (reference).",
        "",
        "Public API: `hvd_gradq.quantize` / `dequantize` (input checks, kernels, header and checksum, "
        "parsing); the issue's targets apply to it. Kernels only: `hvd_gradq.kernels.encode(..., out=...)` / "
        "`decode(..., out=...)` (numba, preallocated output buffers, bit-identical to the reference: "
        "tests/unit/test_kernels.py). Torch native: `torch.quantize_per_tensor` (quint8) + `dequantize`, "
        "one thread, the bar every scheme but ORQ/BinGrad should beat. Reference: "
        "`scheme.encode(NUMPY, ...)` / `scheme.decode(NUMPY, ...)`.",
        "",
        f"Load average during the run: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs "
        "(a shared machine: wall-clock figures include time spent waiting for a CPU and for memory).",
        "",
    ]
    for clock, key, label in (("wall", "", "wall clock"), ("cpu", "_cpu", "thread CPU time")):
        cms = copy_ms if clock == "wall" else copy_cpu
        lines += [
            f"## {label} (copy: {cms:.2f} ms, {x.nbytes / cms / 1e6:.1f} GB/s)",
            "",
            "| scheme | path | encode ms | decode ms | total ms | % of copy bandwidth | target | met? |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            if "total_ms" in r:
                e, d = r["encode" + key + "_ms"], r["decode" + key + "_ms"]
                pct = cms / (e + d) * 100.0
                lines.append(
                    f"| {r['scheme']} | {r['path']} | {e:.1f} | {d:.1f} | {e + d:.1f} | {pct:.2f}% "
                    f"| {r['target_pct']:.0f}% | {'yes' if pct >= r['target_pct'] else 'no'} |"
                )
            else:
                lines.append(f"| {r['scheme']} | {r['path']} | - | - | - | - | {r['target_pct']:.0f}% | {r['note']} |")
        lines.append("")
    lines += [
        f"## decoding and summing N-1 = 3 payloads (wall clock; target {SUM_TARGET:.0f}% of a copy of the same "
        "elements: 3 x copy_ms)",
        "",
        "| scheme | decode+sum ms | % of copy | met? |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        if r.get("path") == "public API" and r.get("sum3_ms") == r.get("sum3_ms"):
            pct = 3 * copy_ms / r["sum3_ms"] * 100.0
            met = "yes" if pct >= SUM_TARGET else "no"
            lines.append(f"| {r['scheme']} | {r['sum3_ms']:.1f} | {pct:.2f}% | {met} |")
    lines.append("")
    lines += [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"NumPy {np.__version__}" + (f", numba {_numba_version()}" if kernels.available() else "") + ".",
        "",
    ]
    out.write_text("\n".join(lines))
    raw = Path(args.raw)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({"elements": n, "copy_ms": copy_ms, "copy_cpu_ms": copy_cpu, "rows": rows}, indent=1))
    print(f"wrote {out} and {raw}")
    return 0


def _numba_version() -> str:
    import numba

    return str(numba.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
