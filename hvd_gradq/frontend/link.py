"""The link rate the cost model prices bytes with, measured in the job where nobody gave one.

The model's time for a tensor is the bytes one host's link carries each way at a rate, plus the
codec's CPU (:func:`hvd_gradq.plan.decide.seconds`). The CPU figures are timed on the job's
ranks (:mod:`.probe`); the rate was a constant (10 Gbit/s) unless the user set ``link_gbps`` /
``HVD_GRADQ_LINK_GBPS``, and the same job on a 100 Mbit/s and a 25 Gbit/s network decides
differently only if someone says which it is on. So at the handshake (the first step over a
process set, before any tensor is decided) the ranks time the collective the model's gather
pattern prices, Horovod's allgather, on payloads of two sizes, each the best of :data:`REPS`:

    t(B) = latency + (N - 1) x B x 8 / rate,

the model's own bytes for an allgather of B-byte payloads over N ranks
(:func:`hvd_gradq.plan.decide.cost`: each host's link carries N - 1 payloads each way), so the
difference of the two times is bytes over rate, with the fixed costs (Horovod's negotiation and
cycle, the eager call) taken out. Every rank times its own calls; the ranks then allgather their
times and take the maximum of each (the slowest rank is the one a collective waits for), so
every rank computes the same rate, bit for bit, and decides alike.

What it costs: (:data:`REPS` + 1) x (:data:`SMALL` + :data:`LARGE`) bytes a rank, once a process
set (a first, untimed call of each size lets Horovod negotiate it): ~4 MB a rank, ~0.35 s at
100 Mbit/s, milliseconds on a data-centre link. It is not measured
where the user gave a rate, where the figures come from the table (``HVD_GRADQ_FIGURES=table``:
decisions that are the same from run to run), or where no collective can run at the handshake
(a TF1-style graph).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..plan.cpu_cost import Figures
from . import probe

#: Bytes a rank of the small and the large payload (float64 elements).
SMALL = 1 << 13
LARGE = 1 << 20
#: Timed calls of each size, the fastest kept (a preempted call only ever makes one longer).
REPS = 3
#: The rates reported at most and at least (Gbit/s): a difference of times below the clock's
#: resolution (a link much faster than the payload can show) reads as :data:`FASTEST`.
FASTEST = 400.0
SLOWEST = 1e-3


@dataclass(frozen=True)
class Link:
    """A measured link: its rate (Gbit/s, agreed) and the agreed times it came from."""

    gbps: float
    small_s: float  # the best allgather of SMALL-byte payloads (the maximum over ranks)
    large_s: float  # ... of LARGE-byte payloads

    def describe(self) -> str:
        """``measured: 0.94 Gbit/s (allgather of 1024 KiB payloads: 9.10 ms; of 8 KiB: 0.21 ms)``."""
        return (f"measured: {self.gbps:.3g} Gbit/s (allgather of {LARGE >> 10} KiB payloads: "
                f"{self.large_s * 1e3:.2f} ms; of {SMALL >> 10} KiB: {self.small_s * 1e3:.2f} ms)")


def rate(nranks: int, small_s: float, large_s: float, small: int = SMALL, large: int = LARGE) -> float:
    """Gbit/s from the agreed best times of the two payloads (module docstring), clamped to
    [:data:`SLOWEST`, :data:`FASTEST`]."""
    moved = (nranks - 1) * (large - small) * 8
    took = large_s - small_s
    if took <= 0:
        return FASTEST
    return float(min(max(moved / took / 1e9, SLOWEST), FASTEST))


def agreed(figures: Figures, allgather: Callable[[NDArray[np.float64]], NDArray[Any]], nranks: int, given: bool,
           links: dict[Hashable, Link], key: Hashable) -> Figures:
    """The handshake's ``figures`` (:func:`.probe.agreed`) with the link rate measured
    (:func:`measure`, recorded in ``links[key]``), unless the user ``given`` one or the figures
    are the table's (``HVD_GRADQ_FIGURES=table``: decisions that are the same in every run)."""
    if given or probe.figures_source() == "table":
        return figures
    links[key] = measured = measure(allgather, nranks)
    return dataclasses.replace(figures, link_gbps=measured.gbps)


def rate_of(figures: Figures | None, configured: float) -> float:
    """The rate the cost model prices with: the one measured with ``figures``, else ``configured``."""
    return figures.link_gbps if figures is not None and figures.link_gbps is not None else configured


def measure(allgather: Callable[[NDArray[np.float64]], NDArray[Any]], nranks: int,
            clock: Callable[[], float] = time.perf_counter, reps: int = REPS) -> Link:
    """Time this rank's allgathers of :data:`SMALL` and :data:`LARGE` payloads (``allgather``: the
    handshake's, over the process set), then agree on the times (one more allgather, the maximum
    over ranks). Every rank runs the same collectives in the same order."""
    best = []
    for size in (SMALL, LARGE):
        payload = np.zeros(size // 8, np.float64)
        allgather(payload)  # a new shape: Horovod negotiates it once; not timed
        took = float("inf")
        for _ in range(reps):
            t = clock()
            allgather(payload)
            took = min(took, clock() - t)
        best.append(took)
    rows = np.asarray(allgather(np.array(best, np.float64)), np.float64).reshape(-1, 2)
    small_s, large_s = (float(v) for v in rows.max(axis=0))
    return Link(rate(nranks, small_s, large_s), small_s, large_s)
