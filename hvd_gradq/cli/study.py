"""The quality study's figures, as data: what each scheme cost in accuracy against fp32.

Copied from ``results/quality/quality.md`` (``bench/quality/study.py --plan main``: 5 seeds a row, each scheme at
its own best learning rate, Δ paired per seed against Horovod's fp32 allreduce run in the same
study). MNIST-1D is an MLP trained with momentum SGD (test accuracy, points); chars is a
0.83M-parameter transformer trained with AdamW (test loss, relative). A scheme the study did not
run on a workload has None there. Regenerate by hand when the study is rerun.
"""
from __future__ import annotations

from typing import NamedTuple


class Figure(NamedTuple):
    sgd_w4: float | None  # Δ test accuracy, points, MNIST-1D, 4 workers
    adamw_w4: float | None  # Δ test loss, %, chars, 4 workers (lower is better)
    sgd_w8: float | None  # Δ test accuracy, points, MNIST-1D, 8 workers


#: spec as the study ran it -> its Δ vs fp32 (results/quality/quality.md, summary and block tables)
FIGURES: dict[str, Figure] = {
    "fp16": Figure(+0.40, +0.01, +0.14),
    "orq:levels=5": Figure(+0.88, -0.00, -0.86),
    "orq:levels=3": Figure(-4.52, +0.84, -4.16),
    "orq:levels=9": Figure(+0.32, None, -0.20),
    "bingrad:ef=true": Figure(-0.46, +9.27, -0.28),
    "bingrad:variant=pb,ef=true": Figure(-5.50, None, -6.68),
    "uniform:bits=4": Figure(-0.64, +0.00, -0.82),
    "qsgd:levels=4": Figure(-0.62, None, -0.54),
    "terngrad": Figure(-5.98, None, -5.50),
    "sign:ef=true": Figure(-5.08, None, -8.04),
    "topk:ratio=0.01,ef=true": Figure(-4.36, None, -4.46),
}

#: what "kept the accuracy" means in the study's targets: within 1 point (SGD) or 1% loss (AdamW)
SGD_POINTS = 1.0
ADAMW_PERCENT = 1.0


def kept(spec: str, optimizer: str) -> bool | None:
    """Whether the study saw ``spec`` keep fp32's accuracy with ``optimizer`` (sgd, adamw or any);
    None when it did not run that case."""
    f = FIGURES.get(spec)
    if f is None:
        return None
    sgd = None if f.sgd_w4 is None or f.sgd_w8 is None else min(f.sgd_w4, f.sgd_w8) >= -SGD_POINTS
    adamw = None if f.adamw_w4 is None else f.adamw_w4 <= ADAMW_PERCENT
    if optimizer == "sgd":
        return sgd
    if optimizer == "adamw":
        return adamw
    if sgd is None or adamw is None:
        return None if (sgd is None and adamw is None) else (False if False in (sgd, adamw) else None)
    return sgd and adamw


def describe(spec: str) -> str:
    f = FIGURES.get(spec)
    if f is None:
        return "not in the study"
    parts = []
    if f.sgd_w4 is not None:
        parts.append(f"SGD {f.sgd_w4:+.2f}/{f.sgd_w8:+.2f} pt")
    if f.adamw_w4 is not None:
        parts.append(f"AdamW {f.adamw_w4:+.2f}% loss")
    return ", ".join(parts)
