"""Compile every kernel once, so that no training step waits for numba (set-up runs this).

numba compiles a kernel at its first call and caches the machine code on disk; a fresh process
then loads it in milliseconds. Without a warm cache the first step of a job pauses while the
kernels it needs compile (about 70 s of CPU for all of them on the project's machine; 25 s for
sign alone), more with several ranks compiling at once. This runs each built-in scheme's encode
and decode on a small tensor (or only the SPECs given), which compiles what is missing and loads
what is cached; a second run compiles nothing. It prints where the cache is: the package's
``kernels/__pycache__`` when that is writable, else ``$XDG_CACHE_HOME/hvd_gradq/numba`` (or
``~/.cache/hvd_gradq/numba``); ``HVD_GRADQ_CACHE_DIR`` or ``NUMBA_CACHE_DIR`` choose another.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ..api import dequantize, quantize
from ..errors import GradqError
from ..kernels import available
from ..kernels import feedback as fused
from ..kernels._cache import cache_dir
from ..spec import parse

#: one spec per compiled path: every kernel of every built-in scheme is reached by one of these
SPECS = ["uniform:bits=4", "uniform:bits=8,scales=fp16", "qsgd:levels=4", "qsgd:levels=2,norm=l2", "terngrad",
         "sign", "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3", "orq:levels=5",
         "orq:levels=9", "orq:levels=5,clip=2.5", "topk", "fp16", "none"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", metavar="SPEC",
                   help="schemes to compile for (default: every built-in scheme, each compiled path once)")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def compiles() -> int:
    """Kernels compiled (not loaded from the cache) in this process so far: the compile log's
    count (one INFO line each on ``hvd_gradq.kernels``)."""
    from ..kernels._nb_cache import COMPILES  # numba: imported only once the kernels are wanted

    return COMPILES.compiled


def run(args: argparse.Namespace) -> int:
    if not available():
        raise GradqError("numba is not installed: the kernels cannot be compiled and every scheme runs the NumPy "
                         "reference (10-100x slower); install it with `pip install numba`")
    specs = args.specs or SPECS
    for spec in specs:
        parse(spec)  # every spec checked before anything compiles
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    t_all = time.perf_counter()
    before = compiles()
    for i, spec in enumerate(specs):
        t0, c0 = time.perf_counter(), compiles()
        dequantize(quantize(x, spec))
        if not args.quiet:
            n = compiles() - c0
            what = f"compiled {n} kernel(s)" if n else "from the cache"
            print(f"[{i + 1:2d}/{len(specs)}] {spec:26s} {time.perf_counter() - t0:6.2f} s  {what}", flush=True)
    fused.warm()  # error feedback's two passes, which every scheme with ef=true runs
    total = compiles() - before
    where = cache_dir()
    files = len(list(where.glob("*.nbi")))
    print(f"warm: {len(specs)} schemes in {time.perf_counter() - t_all:.1f} s, {total} kernel(s) compiled; "
          f"cache: {where} ({files} kernel(s) cached)")
    return 0
