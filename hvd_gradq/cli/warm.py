"""Compile every kernel once, so that no training step waits for numba (set-up runs this).

numba compiles a kernel at its first call and caches the machine code on disk; a fresh process
then loads it in milliseconds. Without a warm cache the first step of a job pauses for seconds
per scheme (5-6 s for ORQ-5 or uniform-4 on the project's machine, more with several ranks
compiling at once). This runs each built-in scheme's encode and decode on a small tensor, which
compiles what is missing and loads what is cached; a second run compiles nothing. It prints
where numba keeps the cache (next to the package, or numba's user-wide cache directory when the
package's folder is read-only; ``NUMBA_CACHE_DIR`` overrides both).
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..api import dequantize, quantize
from ..errors import GradqError
from ..kernels import available

#: one spec per compiled path: every kernel of every built-in scheme is reached by one of these
SPECS = ["uniform:bits=4", "uniform:bits=8,scales=fp16", "qsgd:levels=4", "qsgd:levels=2,norm=l2", "terngrad",
         "sign", "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3", "orq:levels=5",
         "orq:levels=9", "orq:levels=5,clip=2.5", "topk", "fp16", "none"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def dispatchers() -> list[Any]:
    """Every numba dispatcher of the package's kernels (their compile statistics say hit or miss)."""
    import numba

    from ..kernels import _nb_common, _nb_even, _nb_levels, _nb_pack, _nb_table

    out = []
    for mod in (_nb_common, _nb_even, _nb_levels, _nb_pack, _nb_table):
        out += [v for v in vars(mod).values() if isinstance(v, numba.core.dispatcher.Dispatcher)]
    return out


def compiles() -> int:
    """Kernels compiled (not loaded from the cache) in this process so far."""
    return sum(sum(d.stats.cache_misses.values()) for d in dispatchers())


def run(args: argparse.Namespace) -> int:
    if not available():
        raise GradqError("numba is not installed: the kernels cannot be compiled and every scheme runs the NumPy "
                         "reference (10-100x slower); install it with `pip install numba`")
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    t_all = time.perf_counter()
    before = compiles()
    for i, spec in enumerate(SPECS):
        t0, c0 = time.perf_counter(), compiles()
        dequantize(quantize(x, spec))
        if not args.quiet:
            n = compiles() - c0
            what = f"compiled {n} kernel(s)" if n else "from the cache"
            print(f"[{i + 1:2d}/{len(SPECS)}] {spec:26s} {time.perf_counter() - t0:6.2f} s  {what}", flush=True)
    paths = sorted({d.stats.cache_path for d in dispatchers() if d.stats.cache_path})
    total = compiles() - before
    print(f"warm: {len(SPECS)} schemes in {time.perf_counter() - t_all:.1f} s, {total} kernel(s) compiled; "
          f"cache: {', '.join(paths) or 'none (numba could not write one: every process will compile)'}")
    return 0
