#!/usr/bin/env python3
"""How much longer a job's first step with a scheme takes than its second: the compile pause.

    .venv/bin/python bench/micro/first_step.py                  # ORQ-5, ORQ-3, uniform-4, BinGrad
    .venv/bin/python bench/micro/first_step.py orq:levels=5     # one scheme

For each scheme, two fresh processes share one empty cache folder (``HVD_GRADQ_CACHE_DIR``):
the first finds it cold and compiles the kernels the scheme needs (a machine where nobody ran
``python -m hvd_gradq warm``); the second finds them cached (a machine set up by
``scripts/setup.sh``). Each process imports hvd_gradq, then times two steps, each one
``quantize`` + ``dequantize`` of a small model's tensors (a 1M-element matrix, a 64k one and a
bias: the shapes barely matter, the compile is per kernel and signature). The first step
includes importing numba, which hvd_gradq does on first use. The target (issue 24): with a warm
cache, the first step costs less than 1 s more than the second. Each step's CPU seconds (the
process's, all threads) are printed beside its wall seconds: on a busy machine the wall figures
stretch with the load average (printed), the CPU ones much less, and on an idle core the two
agree.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = ["orq:levels=5", "orq:levels=3", "uniform:bits=4", "bingrad"]
TARGET_S = 1.0


def child(spec: str) -> None:
    """One fresh process: two steps of ``spec``, their seconds as JSON on stdout."""
    t0 = time.perf_counter()
    import numpy as np

    import hvd_gradq

    imported = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in ((1024, 1024), (256, 256), (1024,))]
    steps, cpu = [], []
    for _ in range(2):
        t, c = time.perf_counter(), time.process_time()
        for x in tensors:
            hvd_gradq.dequantize(hvd_gradq.quantize(x, spec))
        steps.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    from hvd_gradq.kernels._nb_cache import COMPILES

    print(json.dumps({"import_s": imported, "first_s": steps[0], "second_s": steps[1], "first_cpu_s": cpu[0],
                      "second_cpu_s": cpu[1], "compiled": COMPILES.compiled}))


def run_child(spec: str, cache: Path) -> dict[str, float]:
    env = {**os.environ, "HVD_GRADQ_CACHE_DIR": str(cache)}
    cp = subprocess.run([sys.executable, __file__, "--child", spec], env=env, cwd=ROOT, capture_output=True,
                        text=True, check=True)
    return dict(json.loads(cp.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("specs", nargs="*", help=f"schemes (default: {' '.join(SPECS)})")
    ap.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'scheme':16s} {'cache':5s} {'compiled':>8s} {'import s':>9s} {'1st step s':>11s} "
          f"{'2nd step s':>11s} {'1st - 2nd':>10s} {'CPU: 1st - 2nd':>15s}")
    worst, worst_cpu = 0.0, 0.0
    for spec in args.specs or SPECS:
        with tempfile.TemporaryDirectory(prefix="hvd_gradq-first-step-") as tmp:
            for state in ("cold", "warm"):
                r = run_child(spec, Path(tmp))
                extra = r["first_s"] - r["second_s"]
                extra_cpu = r["first_cpu_s"] - r["second_cpu_s"]
                if state == "warm":
                    worst, worst_cpu = max(worst, extra), max(worst_cpu, extra_cpu)
                print(f"{spec:16s} {state:5s} {int(r['compiled']):8d} {r['import_s']:9.2f} {r['first_s']:11.2f} "
                      f"{r['second_s']:11.3f} {extra:10.2f} {extra_cpu:15.2f}", flush=True)
    print(f"warm cache: the first step costs at most {worst:.2f} s more than the second ({worst_cpu:.2f} s of CPU); "
          f"target < {TARGET_S:g} s: {'met' if worst < TARGET_S else 'NOT met'} in wall time, "
          f"{'met' if worst_cpu < TARGET_S else 'NOT met'} in CPU time; load average at end: "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
