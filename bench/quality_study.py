"""Quality study: what each scheme costs in accuracy and gradient error on MNIST-1D.

Part 1 (training): the MNIST-1D CNN of ``bench/train_mnist1d.py`` on 4 ranks
(``horovodrun -np 4 --gloo``), every scheme x 3 seeds, final test accuracy (mean and spread)
against the bytes each rank sent -> ``results/quality.md``, ``results/quality_accuracy_vs_bytes.png``.
All runs share one ``horovodrun`` launch (a worker mode of this script calls the example's
``train()`` once per run), because starting Horovod and torch costs more than a short run on a
small machine; each finished run is saved at once under ``results/raw/quality/`` and a
relaunch resumes with the runs that are missing (``--fresh`` starts over).

Part 2 (error): gradients captured from that training (rank 0's local gradients at a few steps
of the uncompressed seed-0 run, ``--dump-grads``) are quantized offline by every scheme:
relative error E||Q(x)-x||^2/||x||^2, split into bias^2 ||E Q(x)-x||^2/||x||^2 and variance, against
bits an element; ORQ's variance against the exact optimum (a dynamic program over data points,
buckets of 128) and BinGrad-b's error against the exact 2-means optimum ->
``results/quality_error.md``, ``results/error_vs_bits.png``.

The grid and its worker are in ``quality_grid.py``, part 2 in ``quality_error.py``, the reports
in ``quality_tables.py`` and the plots in ``quality_plots.py``.

    .venv/bin/python bench/quality_study.py                 # both parts (~35 min on 2 busy cores)
    .venv/bin/python bench/quality_study.py --part error    # part 2 only (needs the dump)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from quality_config import ROOT, SCHEMES
from quality_error import error_part
from quality_grid import aggregate, train_part, worker
from quality_plots import plot_training
from quality_tables import write_training_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["all", "train", "error"], default="all")
    ap.add_argument("--np", type=int, default=4, help="ranks")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of every scheme")
    ap.add_argument("--target-seeds", type=int, default=3,
                    help="seeds of none and the schemes with targets (ORQ-5, ORQ-3, BinGrad+EF), if more")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--schemes", default=";".join(SCHEMES), help="';'-separated specs")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--raw", default=str(ROOT / "results" / "raw" / "quality"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one horovodrun launch may take")
    ap.add_argument("--tag", default="", help="suffix of the part-1 files: results/quality<TAG>.md, ...")
    ap.add_argument("--fresh", action="store_true", help="ignore runs saved by an earlier study")
    ap.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    a.schemes = [s.strip() for s in a.schemes.split(";") if s.strip()]
    out, raw = Path(a.out), Path(a.raw)
    out.mkdir(parents=True, exist_ok=True)
    rows = None
    if a.part in ("all", "train"):
        t0 = time.monotonic()
        results = train_part(a, raw)
        rows = aggregate(results, a.schemes)
        verdicts = write_training_report(a, rows, out, time.monotonic() - t0)
        plot_training(rows, out / f"quality{a.tag}_accuracy_vs_bytes.png", a.np, a.optimizer)
        print((out / f"quality{a.tag}.md").read_text())
        print("\n".join(verdicts))
    if a.part in ("all", "error"):
        error_part(a, raw, out, rows)
        print((out / "quality_error.md").read_text())


if __name__ == "__main__":
    main()
