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

The large payload grows (x4 a round, from :data:`LARGE` to :data:`MOST`) until the difference
is at least :data:`SPAN` and :data:`OVER` times the small call's time: on a fast link or a loaded
machine, 1 MiB moves in less time than the fixed cost varies by (Horovod's cycle, a preempted
rank), and a difference of noise read as a rate is wrong by any factor. The ranks agree on the
times after each round and decide from the agreed ones, so they grow alike.

What it costs: (:data:`REPS` + 1) calls of each size it tried, once a process set (a first,
untimed call of each size lets Horovod negotiate it): ~4 MB a rank and ~0.35 s at 100 Mbit/s
(1 MiB suffices); ~21 MB and ~0.2 s at 1 Gbit/s; milliseconds on a data-centre link. It is not
measured where the user gave a rate, where the figures come from the table
(``HVD_GRADQ_FIGURES=table``: decisions that are the same from run to run), or where no
collective can run at the handshake (a TF1-style graph).
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

#: Bytes a rank of the small and the first large payload (float64 elements).
SMALL = 1 << 13
LARGE = 1 << 20
#: The large payload's most bytes a rank, and all ranks' together (what an allgather returns).
MOST = 1 << 24
GATHERED = 1 << 28
#: The difference of the two times is trusted from this many seconds and this many small calls.
SPAN = 0.02
OVER = 4.0
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
    large_s: float  # ... of large-byte payloads
    large: int = LARGE  # the large payload's bytes a rank, where the difference was trusted

    def describe(self) -> str:
        """``measured: 0.94 Gbit/s (allgather of 4096 KiB payloads: 34.6 ms; of 8 KiB: 0.21 ms)``."""
        return (f"measured: {self.gbps:.3g} Gbit/s (allgather of {self.large >> 10} KiB payloads: "
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
    """Time this rank's allgathers of :data:`SMALL` and of large payloads (``allgather``: the
    handshake's, over the process set) and agree on the times after each large size (one more
    allgather, the maximum over ranks); grow the large payload until the agreed difference is
    trusted (module docstring). Every rank runs the same collectives in the same order: whether
    to grow is read from the agreed times only."""
    small = _best(allgather, SMALL, clock, reps)
    large, most = LARGE, largest(nranks)
    while True:
        rows = np.asarray(allgather(np.array([small, _best(allgather, large, clock, reps)], np.float64)), np.float64)
        small_s, large_s = (float(v) for v in rows.reshape(-1, 2).max(axis=0))
        if large_s - small_s >= max(SPAN, OVER * small_s) or large * 4 > most:
            return Link(rate(nranks, small_s, large_s, large=large), small_s, large_s, large)
        large *= 4


def largest(nranks: int) -> int:
    """The large payload's most bytes a rank: :data:`MOST`, fewer where all ranks' together would
    pass :data:`GATHERED`, never fewer than :data:`LARGE`."""
    most = LARGE
    while most * 4 <= MOST and most * 4 * nranks <= GATHERED:
        most *= 4
    return most


def _best(allgather: Callable[[NDArray[np.float64]], NDArray[Any]], size: int,
          clock: Callable[[], float], reps: int) -> float:
    """This rank's fastest of ``reps`` allgathers of ``size``-byte payloads, after an untimed one
    (a new shape: Horovod negotiates it once)."""
    payload = np.zeros(size // 8, np.float64)
    allgather(payload)
    took = float("inf")
    for _ in range(reps):
        t = clock()
        allgather(payload)
        took = min(took, clock() - t)
    return took
