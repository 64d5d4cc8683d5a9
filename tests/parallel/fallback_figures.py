"""The fp16-fallback checks' stand-in for the start-up probe, shared by the PyTorch and
TensorFlow hierarchical workers: each rank "measures" its own CPU figures (rank 0 a codec next
to free, every other rank one hundreds of times slower, each its own), so that alone they would
decide apart, and the check shows that the agreed maximum makes them decide alike."""
from __future__ import annotations

import contextlib
from collections.abc import Callable

from measuring_link import measuring_with

from hvd_gradq.frontend import probe
from hvd_gradq.plan.cpu_cost import CAST, Figures
from hvd_gradq.plan.decide import decide
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.spec import parse


def figures_of(rank: int) -> Callable[..., Figures]:
    """A ``probe.measure`` stand-in returning ``rank``'s own figures for the schemes it is asked."""

    def own(schemes, cast=None, elements=probe.ELEMENTS, reps=probe.REPS) -> Figures:  # probe.measure's signature
        e, d = (0.01, 0.01) if rank == 0 else (400.0 + rank, 40.0)
        return Figures(tuple((s.spec, e, d) for s in schemes) + ((CAST, 0.1, 0.1 + rank / 100),))

    return own


def measured_as(rank: int) -> contextlib.AbstractContextManager[None]:
    """Compressors built inside time nothing and "measure" ``rank``'s figures; the harness pins
    the shipped table (``HVD_GRADQ_FIGURES=table``), so the block turns measuring back on."""
    return measuring_with(figures_of(rank))


def alone(spec: str, n: int, rank: int, size: int, local: int, link: float) -> str:
    """The pattern ``rank`` would choose for a tensor of ``n`` elements with its own figures only."""
    config = parse(spec)
    mine = figures_of(rank)(probe.schemes_for(config.scheme, size, local))
    return decide(config, n, 1, size, Pattern.AUTO, local=local, link_gbps=link, figures=mine).pattern.value
