"""What encoding and decoding cost a rank, per element: the CPU term of the pattern cost model.

The frontends measure the schemes they use at start-up on every rank (:mod:`.probe`) and agree
through their first-step handshake on the maximum over ranks (:class:`Figures`): a per-rank
timing alone would differ between ranks and split a collective, the agreed maximum cannot.
Callers with no job at hand (``advise``, the benchmarks' models, unit tests) read a measured
table (:mod:`.cpu_table`, written by ``bench/scale/calibrate_cpu.py``). A scheme the table lacks
is interpolated in its level count (ORQ's search grows about linearly in the levels past 5;
QSGD and uniform barely move), and a scheme family it lacks gets :data:`UNKNOWN`, a cost on the
slow side so that such a scheme is not sent down a pattern that multiplies its decoding.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from ..schemes.scheme import Scheme
from .cpu_table import NS_PER_ELEMENT

UNKNOWN = (10.0, 2.0)
#: Adding one float32 array into another, a rank's share of summing decoded payloads (ns an element).
ADD_NS = 0.6
#: The key of Horovod's fp16 cast (float32 -> float16 before its allreduce, back after) in :class:`Figures`.
CAST = "horovod:fp16-cast"
#: That cast's (there, back) ns an element when nothing was measured: on the slow side of a
#: framework's vectorized cast (about 0.3-1 ns on x86), so that the table alone sends a tensor
#: to fp16 only where its scheme is clearly slower.
CAST_NS = (1.0, 1.0)


@dataclass(frozen=True)
class Figures:
    """(encode, decode) ns an element measured on this job's ranks, by scheme spec (and
    :data:`CAST`), in place of the table's: what :mod:`.probe` measures at start-up and every
    rank agrees on (the maximum over ranks). Hashable, so the cached cost functions key on it;
    a scheme it lacks falls back to the table."""

    ns: tuple[tuple[str, float, float], ...] = ()

    def get(self, key: str) -> tuple[float, float] | None:
        for k, e, d in self.ns:
            if k == key:
                return e, d
        return None


def figures_for(scheme: Scheme, figures: Figures | None) -> tuple[float, float]:
    """(encode, decode) ns an element of ``scheme``: measured where ``figures`` has it, else the table."""
    got = figures.get(scheme.spec) if figures is not None else None
    return got if got is not None else ns_per_element(scheme)


def cast_ns(figures: Figures | None) -> tuple[float, float]:
    """Horovod's fp16 cast there and back (ns an element): measured, else :data:`CAST_NS`."""
    got = figures.get(CAST) if figures is not None else None
    return got if got is not None else CAST_NS


def table_key(scheme: Scheme) -> str:
    """The table's key for a scheme: its name and the one parameter that changes its speed,
    as the scheme declares them (:attr:`~hvd_gradq.schemes.scheme.Scheme.speed_key`: ``orq:5``),
    so that a new scheme needs no line here."""
    return scheme.speed_key


@functools.lru_cache(maxsize=1024)
def ns_per_element(scheme: Scheme) -> tuple[float, float]:
    """(encode, decode) nanoseconds an element for ``scheme`` on one core."""
    key = table_key(scheme)
    if key in NS_PER_ELEMENT:
        return NS_PER_ELEMENT[key]
    family, _, arg = key.partition(":")
    points = sorted((int(k.partition(":")[2]), v) for k, v in NS_PER_ELEMENT.items()
                    if k.partition(":")[0] == family and k.partition(":")[2].isdigit())
    if not arg.isdigit() or len(points) < 2:
        return UNKNOWN
    x = int(arg)
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)  # the segment around x, or the last one
    (x0, (e0, d0)), (x1, (e1, d1)) = points[i - 1], points[i]
    t = (x - x0) / (x1 - x0)
    return max(e0 + t * (e1 - e0), 0.1), max(d0 + t * (d1 - d0), 0.1)
