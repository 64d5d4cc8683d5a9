#!/usr/bin/env python3
"""A step's fixed cost a tensor: many small tensors through ``DistributedOptimizer``, this tree
against another commit, in alternating launches (a ratio).

    .venv/bin/python bench/micro/many_tensors.py                      # against main
    .venv/bin/python bench/micro/many_tensors.py --against main,a409919 --tensors 400 --steps 30 --rounds 3
    .venv/bin/python bench/micro/many_tensors.py --against hvd:fp16 --spec sign  # against Horovod's own fp16

What a compressor adds to every tensor (its Python, its collectives, Horovod's negotiation of
each) is invisible in a few large tensors and dominates a model of hundreds of small ones
(issue 33: a tensor's fixed cost at most 60 us). Each launch is ``horovodrun -np 2 -H
localhost:2 --gloo`` (loopback), one CPU thread a rank, and trains a model of ``--tensors``
parameters of ``--elements`` elements each (the loss a weighted sum of every parameter, so
backward costs next to nothing and the step is the reduction) with ``hvd.DistributedOptimizer``
and ``--spec``, for ``--steps`` steps; a rank reports the median step after the first
``--skip`` (the handshake, the first compile). Launches alternate between the other commits
(each checked out into a git worktree, ``/tmp/hvd_gradq_at_<commit>``, as ``vs_commit.py`` does)
and this tree, ``--rounds`` times; the table gives each launch's median, each tree's median of
them and the ratios this / other. On a shared machine only the ratio of interleaved launches means
anything: the load average is printed before and after.

``--against hvd:fp16`` (or ``hvd:none``) sets Horovod's own ``hvd.Compression.fp16`` (``none``)
beside this tree, in the same alternating launches: issue 33's "a model of hundreds of small
layers is not slower than with Horovod fp16". Each hvd_gradq launch also reports the time its
compressor spent inside ``compress()``/``decompress()`` a tensor (``stats()``, the steps after
``--skip``): issue 33's fixed cost, at most 60 us a 4,096-element tensor with a cheap scheme.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def worker(args: argparse.Namespace) -> None:
    """One rank: the model, the optimizer, the timed steps; rank 0 writes the report."""
    import time

    import horovod.torch as hvd
    import torch

    import hvd_gradq
    import hvd_gradq.torch as gq

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(args.elements) * 0.01)
                                   for _ in range(args.tensors))
    weights = [torch.randn(args.elements) for _ in range(args.tensors)]
    named = [(f"p{i}", p) for i, p in enumerate(model)]
    horovod = args.spec.startswith("hvd:")
    comp: Any = (getattr(hvd.Compression, args.spec[4:]) if horovod else
                 gq.from_spec(args.spec, named_parameters=named, pattern=args.pattern))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=named,
                                   compression=comp)
    times = []
    spent = 0.0
    for step in range(args.steps):
        if step == args.skip and not horovod:
            spent = -_compressor_s(comp)
        t0 = time.perf_counter()
        opt.zero_grad()
        g = 1.0 + 0.1 * step + hvd.rank()
        loss = sum((p * w).sum() for p, w in zip(model, weights)) * g
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    patterns = [] if horovod else sorted({d["pattern"] for d in comp.stats()["tensors"].values()})
    per_tensor = None if horovod else (spent + _compressor_s(comp)) / ((args.steps - args.skip) * args.tensors)
    if hvd.rank() == 0:
        kept = times[args.skip:]
        Path(args.report).write_text(json.dumps({"median_ms": 1e3 * statistics.median(kept),
                                                 "min_ms": 1e3 * min(kept), "file": hvd_gradq.__file__,
                                                 "patterns": patterns, "compressor_us_a_tensor":
                                                 None if per_tensor is None else 1e6 * per_tensor}))


def _compressor_s(comp: Any) -> float:
    """Seconds this rank's compressor has spent inside compress()/decompress() so far."""
    return float(comp.stats()["time"]["total"].get("compressor_s", 0.0))


def launch(tree: Path, spec: str, args: argparse.Namespace) -> dict[str, object]:
    """One ``horovodrun`` launch of this script's worker with ``tree``'s hvd_gradq and ``spec``."""
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    with tempfile.TemporaryDirectory(prefix="many-tensors-") as out:
        report = str(Path(out) / "report.json")
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2", HVD_GRADQ_FALLBACK="0",
                   HVD_GRADQ_FIGURES="table")
        cmd = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(Path(__file__).resolve()),
               "--worker", "--report", report, "--spec", spec, "--pattern", args.pattern,
               "--tensors", str(args.tensors), "--elements", str(args.elements), "--steps", str(args.steps),
               "--skip", str(args.skip)]
        subprocess.run(cmd, env=env, cwd=str(tree), check=True, capture_output=True, text=True, timeout=900)
        got: dict[str, object] = json.loads(Path(report).read_text())
    assert str(got["file"]).startswith(str(tree)), f"imported {got['file']}, not the tree {tree}"
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="main",
                    help="the other commits, or hvd:fp16 / hvd:none (Horovod's own), comma-separated (default: main)")
    ap.add_argument("--spec", default="sign")
    ap.add_argument("--pattern", default="auto")
    ap.add_argument("--tensors", type=int, default=400)
    ap.add_argument("--elements", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of the median")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of alternating launches, one a tree")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    sys.path.insert(0, str(ROOT))  # not in a worker: it imports the hvd_gradq of its launch's tree
    from bench.micro.vs_commit import worktree

    horovods = [ref for ref in args.against.split(",") if ref.startswith("hvd:")]
    commits = [subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True,
                              text=True).stdout.strip() for ref in args.against.split(",")
               if ref and not ref.startswith("hvd:")]
    # (label, tree, spec): the other commits with --spec, Horovod's own compressions, then this tree
    runs = ([(c, worktree(c), args.spec) for c in commits] + [(h, ROOT, h) for h in horovods]
            + [("this tree", ROOT, args.spec)])
    others = [name for name, _, _ in runs[:-1]]
    print(f"load average before: {' / '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{args.tensors} tensors of {args.elements} elements, {args.spec}, pattern={args.pattern}, "
          f"{args.steps} steps (median after {args.skip}), 2 ranks on loopback; ms a step "
          "(this tree's compressor: us a tensor inside compress()/decompress(), rank 0)")
    print("| round | " + " | ".join(name for name, _, _ in runs) + " | " +
          " | ".join(f"this / {c}" for c in others) + " | compressor us a tensor |")
    print("|---|" + "---:|" * (len(runs) + len(others) + 1))
    got: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    us: list[float] = []
    for i in range(args.rounds):
        for name, tree, spec in runs:
            rep = launch(tree, spec, args)
            got[name].append(float(rep["median_ms"]))  # type: ignore[arg-type]
            if name == "this tree" and rep.get("compressor_us_a_tensor") is not None:
                us.append(float(rep["compressor_us_a_tensor"]))  # type: ignore[arg-type]
        this = got["this tree"][-1]
        print(f"| {i + 1} | " + " | ".join(f"{got[n][-1]:.1f}" for n, _, _ in runs) + " | " +
              " | ".join(f"{this / got[c][-1]:.3f}" for c in others) + f" | {us[-1] if us else float('nan'):.1f} |",
              flush=True)
    med = {n: statistics.median(v) for n, v in got.items()}
    print("| median | " + " | ".join(f"{med[n]:.1f}" for n, _, _ in runs) + " | " +
          " | ".join(f"{med['this tree'] / med[c]:.3f}" for c in others) +
          f" | {statistics.median(us) if us else float('nan'):.1f} |")
    print(f"load average after: {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
