#!/usr/bin/env python3
"""Peak resident memory a rank of one huge parameter's step, hvd_gradq against stock Horovod.

    .venv/bin/python bench/scale/peak_memory.py                       # 50M elements, the default table
    .venv/bin/python bench/scale/peak_memory.py --elements 100e6 --out results/scale/peak_memory.md

One ``horovodrun --gloo -np 2`` launch an entry (so that a rank's resting memory holds only
what that entry loads: numba's compiled kernels are ~0.15 GiB), each on a parameter of
``--elements`` float32 elements under ``hvd.DistributedOptimizer`` (plain SGD, no momentum, so the
optimizer keeps no state): ``stock`` (``hvd.Compression.none``: Horovod's fp32 allreduce, in place on
the gradient), ``stock-fp16``, then every scheme of ``--schemes`` with each pattern of ``--patterns``
it accepts, with and without error feedback. The gradient is a fresh random tensor each step (a hook
on ``p.sum()``'s gradient), as backward makes one, so a step holds the parameter, its gradient and
whatever the reduction adds. After one untimed step (the kernels' compile, the handshake), the
kernel's high-water mark of the process (``VmHWM``) is reset (``/proc/self/clear_refs``), two steps
run, and ``VmHWM`` is read: that step's peak. The table gives each rank's peak, the larger over the
ranks against stock's, and what it adds over stock in units of the gradient (n x 4 bytes): the
number of full-size float32 buffers the reduction holds at once beyond Horovod's; and the step's rise
above the resting memory before it (the parameter, residuals and loaded libraries excluded), in the
same units.

Large tensors only: a rank's resting memory (Python, torch, Horovod) is ~0.4 GiB, so a gradient of
tens of millions of elements is needed for the reduction's buffers to show. The launcher refuses a
size whose estimate (2 ranks x 14 gradients, 20 with the summable pattern) exceeds half the
available memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

DEFAULT_SCHEMES = "orq,bingrad,uniform"
DEFAULT_PATTERNS = "gather,scatter,summable"
GIB = float(1 << 30)


def entries(schemes: list[str], patterns: list[str]) -> list[tuple[str, str]]:
    """(spec, pattern) of every run: Horovod's own first, then each scheme x pattern it takes
    (summable: the schemes that declare it), EF off and on."""
    import hvd_gradq
    from hvd_gradq.schemes.scheme import Combine

    out = [("stock", ""), ("stock-fp16", "")]
    for scheme in schemes:
        summable = hvd_gradq.parse(scheme).scheme.combine is Combine.SUMMABLE
        for pattern in patterns:
            if pattern == "summable" and not summable:
                continue
            for ef in ("false", "true"):
                out.append((f"{scheme}:ef={ef}", pattern))
    return out


# ================================================================================== the worker


def _status_kib(field: str) -> int:
    """A KiB figure of this process's ``/proc/self/status`` (``VmHWM``: the peak RSS, ``VmRSS``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _hwm_kib() -> int:
    return _status_kib("VmHWM")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak RSS to the current RSS
        f.write("5")


def worker(n: int, runs: list[tuple[str, str]], out_dir: str) -> None:
    import gc

    import horovod.torch as hvd
    import torch

    import hvd_gradq
    import hvd_gradq.torch as gq

    hvd.init()
    torch.set_num_threads(1)
    rank = hvd.rank()
    gen = torch.Generator().manual_seed(1 + rank)
    results: list[dict[str, Any]] = []
    for i, (spec, pattern) in enumerate(runs):
        name = f"w{i}"
        p = torch.nn.Parameter(torch.zeros(n))
        p.register_hook(lambda g: torch.randn(n, generator=gen))  # a fresh gradient, as backward makes one
        row: dict[str, Any] = {"spec": spec, "pattern": pattern}
        try:
            if spec == "stock":
                comp: Any = hvd.Compression.none
            elif spec == "stock-fp16":
                comp = hvd.Compression.fp16
            else:
                comp = gq.from_spec(spec, named_parameters=[(name, p)], pattern=pattern, fallback=False)
            opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1e-6), named_parameters=[(name, p)],
                                           compression=comp)
            for k in range(3):  # the first: compile, handshake, probe; then two measured
                if k == 1:
                    gc.collect()
                    rest = _rss_kib()
                    _reset_hwm()
                opt.zero_grad()
                p.sum().backward()
                opt.step()
            row.update(peak=_hwm_kib() * 1024, rest=rest * 1024)
            if hasattr(comp, "stats"):
                row["took"] = sorted(k for k in comp.stats()["last_step"] if k != "all")
            del opt, comp
        except hvd_gradq.GradqError as e:  # a pattern the scheme does not take: every rank alike
            row["skipped"] = str(e).split(";")[0][:160]
        del p
        gc.collect()
        results.append(row)
        print(f"[{rank}] {spec} {pattern}: {row.get('peak', 0) / GIB:.2f} GiB {row.get('skipped', '')}", flush=True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def _rss_kib() -> int:
    return _status_kib("VmRSS")


# ================================================================================ the launcher


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def table(n: int, ranks: list[list[dict[str, Any]]]) -> str:
    """The report: each entry's peak on each rank, the larger against stock's, and what it adds
    over stock in gradients (n x 4 bytes)."""
    grad = 4.0 * n
    stock = max(r[0]["peak"] for r in ranks)
    head = ["spec", "pattern", "took", *[f"rank {i} GiB" for i in range(len(ranks))], "peak / stock",
            "above stock (gradients)", "step above rest (gradients)"]
    rows = [head]
    for j, row in enumerate(ranks[0]):
        label = [row["spec"], row["pattern"] or "-", ",".join(row.get("took", [])) or "-"]
        if "skipped" in row:
            rows.append([*label, *["-"] * len(ranks), "-", f"not taken: {row['skipped']}", "-"])
            continue
        peaks = [r[j]["peak"] for r in ranks]
        top = max(peaks)
        step = max(r[j]["peak"] - r[j]["rest"] for r in ranks)
        rows.append([*label, *[f"{v / GIB:.2f}" for v in peaks], f"{top / stock:.2f}x", f"{(top - stock) / grad:+.2f}",
                     f"{step / grad:.2f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=float, default=50e6, help="elements of the one parameter (default 50e6)")
    ap.add_argument("--schemes", default=DEFAULT_SCHEMES, help=f"comma-separated specs (default {DEFAULT_SCHEMES})")
    ap.add_argument("--patterns", default=DEFAULT_PATTERNS, help=f"comma-separated (default {DEFAULT_PATTERNS})")
    ap.add_argument("--out", help="also write the report (markdown) here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # the folder the ranks write to
    ap.add_argument("--runs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = int(args.elements)
    if args.worker:
        worker(n, [tuple(r) for r in json.loads(args.runs)], args.worker)
        return
    # a rank's peak, measured (results/scale/peak_memory.md): up to ~14 gradients with error
    # feedback before this change, ~20 with the summable pattern, over ~0.5 GiB of libraries
    per_rank = 4 * n * (20 if "summable" in args.patterns else 14) + (1 << 29)
    need = 2 * per_rank
    if need > available_bytes() // 2:
        sys.exit(f"{n:,} elements need about {need / GIB:.1f} GiB for 2 ranks, more than half the available "
                 f"{available_bytes() / GIB:.1f} GiB: use fewer --elements")
    runs = entries(args.schemes.split(","), args.patterns.split(","))
    venv = Path(sys.executable).parent
    horovodrun = str(venv / "horovodrun") if (venv / "horovodrun").exists() else "horovodrun"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ranks: list[list[dict[str, Any]]] = [[], []]
    for run in runs:  # one launch an entry: a rank's resting memory holds that entry's libraries only
        with tempfile.TemporaryDirectory(prefix="peakmem-") as out:
            cmd = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
                   str(Path(__file__).resolve()), "--elements", str(n), "--worker", out, "--runs", json.dumps([run])]
            subprocess.run(cmd, check=True, env=env, cwd=ROOT)
            for r in range(2):
                ranks[r] += json.loads(Path(out, f"rank{r}.json").read_text())
    text = (f"Peak resident memory a rank, one parameter of {n:,} float32 elements ({4 * n / GIB:.2f} GiB), "
            f"2 ranks (Gloo), plain SGD; `took`: the pattern the step ran\n\n{table(n, ranks)}\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
