"""The one pattern table: a pattern -> its phases, how a driver runs their first segment, and the
owner residuals it keeps. Every driver (PyTorch's, TensorFlow's, the quality study's loopback)
looks a decided pattern up here (:func:`phases`), with the whole choice
(:class:`hvd_gradq.plan.decide.Choice`: the hierarchical pattern's cross-host part included);
none maps a pattern to code itself.

**Sizes.** A frontend that must size a tensor's residuals before its first reduction (TensorFlow
makes its ``tf.Variable`` s once, at the first trace) asks :func:`owner_residuals`: the keys and
widths of the residuals a rank may own under the pattern (``#reduce``, ``#host``,
``#host#reduce``: :mod:`hvd_gradq.feedback`), from the same chunk geometry the phases cut by
(:func:`hvd_gradq.plan.layout.chunk_bounds`), each as wide as the widest part on any rank so
that a checkpoint written on one rank restores on another.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..feedback import host_key, keeps_owner_residuals, reduced_key
from ..plan.decide import Choice
from ..plan.hosts import Hosts
from ..plan.layout import chunk_bounds
from ..plan.pattern import Pattern
from ..xp import Array, Ops
from .core import Group, Part, Phases, Reduction
from .gather import gather, scatter
from .hier import hierarchical
from .summable import summable

#: A pattern's phases on flat float32 ``x`` (of ``ops``' arrays) for one part, given the choice.
Run = Callable[[Reduction, Part, Array, Ops, Choice], Phases]
#: (key, n, bucket, group, choice) -> the (key, width) of each owner residual the pattern keeps.
Widths = Callable[[str, int, int, Group, Choice], list[tuple[str, int]]]
#: (key, n, bucket, group, choice) -> the (key, lo, hi) of each owner residual this rank keeps:
#: the slice of the flat tensor its values belong to.
Owned = Callable[[str, int, int, Group, Choice], list[tuple[str, int, int]]]


def _none(key: str, n: int, bucket: int, g: Group, choice: Choice) -> list[Any]:
    return []


def _widest(n: int, bucket: int, parts: int) -> int:
    return max(hi - lo for lo, hi in chunk_bounds(n, bucket, parts))


def _scatter_widths(key: str, n: int, bucket: int, g: Group, choice: Choice) -> list[tuple[str, int]]:
    return [(reduced_key(key), _widest(n, bucket, g.size))]  # the reduced chunk this rank owns


def _hier_widths(key: str, n: int, bucket: int, g: Group, choice: Choice) -> list[tuple[str, int]]:
    hosts = hosts_of(g)
    pieces = [hi - lo for lo, hi in chunk_bounds(n, bucket, hosts.local)]
    out = [(host_key(key), max(pieces))]  # the piece of the host's sum this rank owns
    if choice.cross is Pattern.SCATTER:  # and the sub-piece it reduces across hosts
        out.append((reduced_key(host_key(key)), max(_widest(m, bucket, hosts.count) for m in pieces)))
    return out


def _scatter_owned(key: str, n: int, bucket: int, g: Group, choice: Choice) -> list[tuple[str, int, int]]:
    lo, hi = chunk_bounds(n, bucket, g.size)[g.rank]
    return [(reduced_key(key), lo, hi)]


def _hier_owned(key: str, n: int, bucket: int, g: Group, choice: Choice) -> list[tuple[str, int, int]]:
    hosts = hosts_of(g)
    lo, hi = chunk_bounds(n, bucket, hosts.local)[hosts.local_rank]
    out = [(host_key(key), lo, hi)]
    if choice.cross is Pattern.SCATTER:
        slo, shi = chunk_bounds(hi - lo, bucket, hosts.count)[hosts.host]
        out.append((reduced_key(host_key(key)), lo + slo, lo + shi))
    return out


def hosts_of(g: Group) -> Hosts:
    """Where the group's ranks sit: ``local`` consecutive ranks a host."""
    return Hosts(g.size, g.local, g.rank)


@dataclass(frozen=True)
class Entry:
    """A pattern's row: ``run`` its phases; ``encodes_first`` whether their first segment is the
    encode (a driver may run it on a worker thread while backward goes on: gather, scatter);
    ``host_fp32`` whether its first phase moves the fp32 tensor through the host (hierarchical:
    a device codec cannot take it); ``widths`` the owner residuals it keeps (:func:`owner_residuals`);
    ``whole`` whether its one payload is the whole tensor (gather: a frontend may write the
    gradient's shape in its header, as TensorFlow does; chunks and pieces are flat); ``raw``
    whether it takes the gradient as it is and decides a stop on NaN/Inf itself (summable: its
    statistics carry the news), where a graph driver hands the others a zeroed tensor and the
    poison instead; ``feeds`` whether its phases can take the gradient without this rank's
    residual and add it themselves, in one pass with the encode (:meth:`Reduction.encode_fed`:
    gather, scatter), so that an eager driver with error feedback hands it over raw
    (``Part(compensated=False)``)."""

    run: Run
    encodes_first: bool = False
    host_fp32: bool = False
    widths: Widths = _none
    whole: bool = False
    raw: bool = False
    feeds: bool = False
    owned: Owned = _none


PATTERNS: dict[Pattern, Entry] = {
    Pattern.GATHER: Entry(lambda red, t, x, ops, c: gather(red, t, x), encodes_first=True, whole=True,
                            feeds=True),
    Pattern.SCATTER: Entry(lambda red, t, x, ops, c: scatter(red, t, x), encodes_first=True, widths=_scatter_widths,
                             feeds=True, owned=_scatter_owned),
    Pattern.SUMMABLE: Entry(lambda red, t, x, ops, c: summable(red, t, x, ops), raw=True),
    Pattern.HIERARCHICAL: Entry(lambda red, t, x, ops, c: hierarchical(red, t, x, hosts_of(t.group), c.cross),
                                host_fp32=True, widths=_hier_widths, owned=_hier_owned),
}


def entry(pattern: Pattern) -> Entry:
    """The row of a pattern that runs on the core (fp32 and fp16 are Horovod's own: no row)."""
    try:
        return PATTERNS[pattern]
    except KeyError:
        raise ValueError(f"pattern {pattern.value} does not run on the reduction core (Horovod's own allreduce)") \
            from None


def phases(choice: Choice, red: Reduction, part: Part, x: Array, ops: Ops) -> Phases:
    """The decided pattern's phases on ``x`` for ``part``: what every driver starts."""
    return entry(choice.pattern).run(red, part, x, ops, choice)


def owned(choice: Choice, key: str, n: int, bucket: int, group: Group) -> list[tuple[str, int, int]]:
    """(key, lo, hi) of each owner residual this rank keeps for tensor ``key`` of ``n`` elements
    under ``choice`` (a pattern that re-quantizes a reduced part; none for fp32, fp16 and the
    others): where in the flat tensor its values belong, so that a step sending the tensor
    uncompressed can deliver them (:meth:`hvd_gradq.feedback.Memory.flush`)."""
    row = PATTERNS.get(choice.pattern)
    return [] if row is None else row.owned(key, n, bucket, group, choice)


def keeps_owners(choice: Choice, ef: bool) -> bool:
    """Whether a rank keeps owner residuals under ``choice``: with error feedback, under a pattern
    that re-quantizes a reduced part (:func:`hvd_gradq.feedback.keeps_owner_residuals`)."""
    return keeps_owner_residuals(ef, second_phase=entry(choice.pattern).widths is not _none)


def owner_residuals(choice: Choice, ef: bool, key: str, n: int, bucket: int, group: Group) -> list[tuple[str, int]]:
    """(key, width) of each owner residual a rank keeps for tensor ``key`` of ``n`` elements under
    ``choice`` (none without error feedback, or for a pattern that quantizes once)."""
    if not keeps_owners(choice, ef):
        return []
    return entry(choice.pattern).widths(key, n, bucket, group, choice)
