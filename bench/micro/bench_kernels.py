"""Time quantize + dequantize of 64 MB of float32 (16M elements, buckets of 512) per scheme and
thread count (``--threads 1 2``: the codec's ``threads=``, one tensor split over that many
threads), as a share of a plain 64 MB copy into a preallocated buffer timed in the same run,
through the public API (``hvd_gradq.quantize``/``dequantize``), the compiled kernels alone
(``hvd_gradq.kernels``, preallocated output buffers) and the NumPy reference (one thread); also
decoding and summing 3 payloads, and torch's own ``quantize_per_tensor``. Writes
results/micro/kernels.md and results/raw/kernels.json.

    .venv/bin/python bench/micro/bench_kernels.py                          # everything (the reference takes minutes)
    .venv/bin/python bench/micro/bench_kernels.py --no-ref --threads 1 2   # the fast path, 1 and 2 threads

**A same-run baseline** (an older commit timed beside this one): ``--tree PATH`` imports
hvd_gradq from another checkout, e.g. a git worktree of the older commit (this script, not the
older one's, so the table has the same columns), and by default writes into that tree's
``results/``::

    git worktree add --detach /tmp/gq_old <commit>
    .venv/bin/python bench/micro/bench_kernels.py --no-ref --tree /tmp/gq_old  # -> /tmp/gq_old/results/micro/kernels.md
    .venv/bin/python bench/micro/bench_kernels.py --no-ref --threads 1 2

A tree whose ``quantize`` has no ``threads=`` runs on one thread and skips the other counts
(``bench/micro/vs_commit.py`` alternates the two trees' processes for a public-API ratio).

Each of encode and decode is reported in ns an element and as a multiple of the copy (ms / copy
ms: 1.0 is memory speed), against the targets of the issue on speed inside a real process, for
the public API at every thread count: encode ORQ-3 and ORQ-5 <= 12x, ORQ-9 <= 60x, BinGrad-b
<= 5x, BinGrad-pb <= 20x, uniform / QSGD / TernGrad / sign <= 3x; every decode <= 3x (it
allocates its output). "% of copy" is copy_ms / total_ms * 100 (quantize+dequantize's bandwidth
as a share of a memcpy's); decode+sum of 3 payloads is set beside 3 copies. Every figure is the
best of several runs (wall clock), as is the copy's.
"""
from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> Path:
    """``--tree PATH`` (read before hvd_gradq is imported): the checkout to time, else this one."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--tree" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if a.startswith("--tree="):
            return Path(a.partition("=")[2]).resolve()
    return ROOT


TREE = _tree()
sys.path.insert(0, str(TREE))

import hvd_gradq  # noqa: E402
from hvd_gradq import kernels  # noqa: E402
from hvd_gradq.spec import parse_scheme  # noqa: E402
from hvd_gradq.xp import NUMPY  # noqa: E402

# (spec, encode target): the most an encode through the public API may take as a multiple of the
# copy (ORQ and BinGrad at the exact optimum); every decode: DECODE_TARGET
SCHEMES: list[tuple[str, float]] = [
    ("uniform:bits=8", 3.0),
    ("uniform:bits=4", 3.0),
    ("sign", 3.0),
    ("qsgd:levels=4", 3.0),
    ("qsgd:levels=1", 3.0),
    ("terngrad", 3.0),
    ("bingrad", 5.0),
    ("bingrad:variant=pb", 20.0),
    ("orq:levels=3", 12.0),
    ("orq:levels=5", 12.0),
    ("orq:levels=9", 60.0),
]
DECODE_TARGET = 3.0


def encode_target(spec: str) -> float:
    """The encode target of ``spec`` (a multiple of a copy); a spec outside the list: its family's."""
    known = dict(SCHEMES)
    if spec in known:
        return known[spec]
    name = parse_scheme(spec).name
    return {"orq": 12.0, "bingrad": 5.0}.get(name, 3.0)




def best_of(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(best wall-clock ms, best process-CPU ms: every thread's) over ``reps`` runs."""
    wall = cpu = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        c1, t1 = time.process_time(), time.perf_counter()
        wall, cpu = min(wall, (t1 - t0) * 1e3), min(cpu, (c1 - c0) * 1e3)
    return wall, cpu


def threads_kw(fn: Callable[..., Any], threads: int) -> dict[str, int] | None:
    """``{"threads": k}`` for ``fn``; {} for one thread where the tree has no ``threads=`` (an
    older checkout), None for more."""
    if "threads" in inspect.signature(fn).parameters:
        return {"threads": threads}
    return {} if threads == 1 else None


def fast_path(spec: str, x: np.ndarray, reps: int, threads: int) -> dict[str, float] | None:
    scheme = parse_scheme(spec)
    n = x.size
    kw = threads_kw(kernels.encode, threads)
    sec = {s.name: s for s in scheme.sections(n)}
    out = {"meta": np.empty(sec["meta"].count, np.float32), "codes": np.empty(sec["codes"].count, np.uint8)}
    parts = kernels.encode(scheme, x, 1, out=out, **(kw or {}))  # compiles (or loads the cache), touches buffers
    if parts is None or kw is None:
        return None
    dst = np.empty(n, np.float32)
    kernels.decode(scheme, parts, n, out=dst, **kw)
    enc = best_of(lambda: kernels.encode(scheme, x, 1, out=out, **kw), reps)
    dec = best_of(lambda: kernels.decode(scheme, parts, n, out=dst, **kw), reps)
    return {"encode_ms": enc[0], "decode_ms": dec[0], "encode_cpu_ms": enc[1], "decode_cpu_ms": dec[1]}


def public_api(spec: str, x: np.ndarray, reps: int, threads: int) -> dict[str, float] | None:
    """``hvd_gradq.quantize`` + ``dequantize`` (what a user calls: input checks, the kernels, the
    payload's header and checksum, parsing it back), and decoding + summing 3 payloads."""
    kw = threads_kw(hvd_gradq.quantize, threads)
    if kw is None:
        return None
    scheme = parse_scheme(spec)
    p = hvd_gradq.quantize(x, scheme, seed=1, **kw)
    hvd_gradq.dequantize(p, **kw)
    enc = best_of(lambda: hvd_gradq.quantize(x, scheme, seed=1, **kw), reps)
    dec = best_of(lambda: hvd_gradq.dequantize(p, **kw), reps)
    three = [hvd_gradq.quantize(x, scheme, seed=k, **kw) for k in (2, 3, 4)]
    acc = np.empty_like(x)
    dkw = threads_kw(kernels.decode, threads) or {}

    def sum3() -> None:
        kernels.decode(scheme, three[0].parts, x.size, out=acc, **dkw)
        for q in three[1:]:
            np.add(acc, hvd_gradq.api.decode_flat(q, *dkw.values()), out=acc)

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
    scheme = parse_scheme(spec)
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
    ap.add_argument("--threads", nargs="+", type=int, default=[1], help="codec thread counts to time (e.g. 1 2)")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose hvd_gradq is timed (default: this one)")
    ap.add_argument("--out", default=str(TREE / "results" / "micro" / "kernels.md"))
    ap.add_argument("--raw", default=str(TREE / "results" / "raw" / "kernels.json"), help="where the JSON goes")
    args = ap.parse_args()
    where = Path(hvd_gradq.__file__).resolve()
    if not where.is_relative_to(TREE):
        raise SystemExit(f"imported hvd_gradq from {where}, not from --tree {TREE}")
    print(f"hvd_gradq from {where.parent}", flush=True)

    n = args.elements
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dst = np.empty_like(x)
    np.copyto(dst, x)
    copy_ms, copy_cpu = best_of(lambda: np.copyto(dst, x), max(15, args.reps))
    print(f"copy of {x.nbytes / 2**20:.0f} MB into a preallocated buffer: {copy_ms:.2f} ms "
          f"({x.nbytes / copy_ms / 1e6:.1f} GB/s)", flush=True)
    specs = args.schemes or [s for s, _ in SCHEMES]
    rows: list[dict[str, Any]] = []
    for spec in specs:
        target = encode_target(spec)
        paths: list[tuple[str, int, dict[str, float] | None]] = []
        if kernels.available():
            for t in args.threads:
                paths.append(("public API", t, public_api(spec, x, args.reps, t)))
                paths.append(("kernels only", t, fast_path(spec, x, args.reps, t)))
        if not args.no_ref:
            paths.append(("reference (NumPy)", 1, reference(spec, x, args.ref_reps)))
        for path, t, r in paths:
            row: dict[str, Any] = {"scheme": spec, "path": path, "threads": t, "encode_target_x": target,
                                   "decode_target_x": DECODE_TARGET}
            if r is None:
                no_threads = t != 1 and threads_kw(hvd_gradq.quantize, t) is None
                row["note"] = ("this tree's codec has no threads=" if no_threads
                               else "no fast path for this scheme (the reference runs instead)")
            else:
                total = r["encode_ms"] + r["decode_ms"]
                row.update(r, total_ms=total, pct_of_copy=copy_ms / total * 100.0,
                           encode_x=r["encode_ms"] / copy_ms, decode_x=r["decode_ms"] / copy_ms)
                row["met"] = row["encode_x"] <= target and row["decode_x"] <= DECODE_TARGET
            rows.append(row)
            if "total_ms" in row:
                print(f"{spec:22s} {path:18s} t={t:<2d} enc {row['encode_ms']:9.1f} ms {row['encode_x']:7.1f}x "
                      f"(<= {target:g}x)  dec {row['decode_ms']:8.1f} ms {row['decode_x']:5.1f}x "
                      f"(<= {DECODE_TARGET:g}x)  {'met' if row['met'] else 'NOT met'}", flush=True)
            else:
                print(f"{spec:22s} {path:18s} t={t:<2d} {row['note']}", flush=True)

    nat = torch_native(x, args.reps)
    if nat is not None:
        total = nat["encode_ms"] + nat["decode_ms"]
        rows.append({"scheme": "torch quantize_per_tensor (quint8)", "path": "torch native", "threads": 1, **nat,
                     "total_ms": total, "pct_of_copy": copy_ms / total * 100.0, "encode_x": nat["encode_ms"] / copy_ms,
                     "decode_x": nat["decode_ms"] / copy_ms})
        print(f"torch quantize_per_tensor+dequantize: {copy_ms / total * 100.0:.2f}% of copy", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    lines = [
        f"# Kernel throughput: quantize + dequantize of {x.nbytes / 2**20:.0f} MB of float32",
        "",
        f"{n} float32 elements ({x.nbytes / 2**20:.0f} MB, standard normal), buckets of 512; `threads`: the "
        "codec's `threads=` (one tensor split in ranges of whole buckets over that many threads, the same bytes; "
        "NUMBA_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=1), `x 1 thread`: total ms at 1 thread / at this "
        f"count (wall: the speed-up; CPU: below 1 is the threads' overhead); hvd_gradq from `{where.parent}`. "
        "Baseline: `np.copyto(dst, src)` into a "
        f"preallocated buffer, best of {max(15, args.reps)} in the same run. Best of {args.reps} runs (fast "
        f"path) and {args.ref_reps} (reference).",
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
    ns = 1e6 / n  # ms -> ns an element
    lines += [
        f"## Encode and decode against a copy (wall clock; copy {copy_ms:.2f} ms = {copy_ms * ns:.3f} ns an element, "
        f"{x.nbytes / copy_ms / 1e6:.1f} GB/s)",
        "",
        "`x copy`: ms / copy ms (1.0 is memory speed). Targets apply to the public API at every thread count.",
        "",
        "| scheme | path | threads | encode ns/el | encode x copy | target | decode ns/el | decode x copy | target "
        "| met? | total ms | x 1 thread |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if "total_ms" not in r:
            lines.append(f"| {r['scheme']} | {r['path']} | {r['threads']} | - | - | <= {r['encode_target_x']:g}x | - "
                         f"| - | <= {r['decode_target_x']:g}x | {r['note']} | - | - |")
            continue
        e, d = r["encode_ms"], r["decode_ms"]
        one = next((q for q in rows if q["scheme"] == r["scheme"] and q["path"] == r["path"]
                    and q["threads"] == 1 and "total_ms" in q and q is not r), None)
        sp = f"{one['total_ms'] / (e + d):.2f}x" if one else "-"
        te, td = r.get("encode_target_x"), r.get("decode_target_x")
        met = "-" if te is None else ("yes" if e / copy_ms <= te and d / copy_ms <= td else
                                      "encode no" if d / copy_ms <= td else
                                      "decode no" if e / copy_ms <= te else "no")
        lines.append(
            f"| {r['scheme']} | {r['path']} | {r['threads']} | {e * ns:.2f} | {e / copy_ms:.1f}x "
            f"| {'-' if te is None else f'<= {te:g}x'} | {d * ns:.2f} | {d / copy_ms:.1f}x "
            f"| {'-' if td is None else f'<= {td:g}x'} | {met} | {e + d:.1f} | {sp} |")
    lines += [
        "",
        f"## process CPU time, every thread's (copy {copy_cpu:.2f} ms): above the wall clock's where threads "
        "wait or spin",
        "",
        "| scheme | path | threads | encode CPU ms | decode CPU ms | CPU / wall |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "total_ms" in r and "encode_cpu_ms" in r:
            c = r["encode_cpu_ms"] + r["decode_cpu_ms"]
            lines.append(f"| {r['scheme']} | {r['path']} | {r['threads']} | {r['encode_cpu_ms']:.1f} "
                         f"| {r['decode_cpu_ms']:.1f} | {c / r['total_ms']:.2f} |")
    lines += [
        "",
        "## decoding and summing N-1 = 3 payloads (wall clock, public API; against 3 copies of the same elements)",
        "",
        "| scheme | threads | decode+sum ms | x 3 copies |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("path") == "public API" and "sum3_ms" in r and r["sum3_ms"] == r["sum3_ms"]:
            lines.append(f"| {r['scheme']} | {r['threads']} | {r['sum3_ms']:.1f} "
                         f"| {r['sum3_ms'] / (3 * copy_ms):.2f}x |")
    lines.append("")
    lines += [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"NumPy {np.__version__}" + (f", numba {_numba_version()}" if kernels.available() else "") + ".",
        "",
    ]
    out.write_text("\n".join(lines))
    raw = Path(args.raw)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({"elements": n, "copy_ms": copy_ms, "copy_cpu_ms": copy_cpu, "tree": str(TREE),
                               "threads": args.threads, "rows": rows}, indent=1))
    print(f"wrote {out} and {raw}")
    return 0


def _numba_version() -> str:
    import numba

    return str(numba.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
