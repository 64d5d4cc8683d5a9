"""The cost model, and the decision it makes for a tensor: which pattern, and why.

**Cost.** :func:`cost` is the bytes one host's link carries each way for one tensor, assuming
Horovod's collectives as they run over Gloo and MPI: allgather and allreduce are rings in rank
order (ranks of a host are consecutive, so a ring crosses each host's link once each way),
alltoall is pairwise. :func:`seconds` adds what encoding and decoding cost a rank
(:mod:`.cpu_cost`, a measured table) to that link time at an assumed rate (``link_gbps``,
default :data:`DEFAULT_LINK_GBPS`; the frontends read ``HVD_GRADQ_LINK_GBPS``). ``auto`` takes
the fastest pattern by that sum, or Horovod's fp16 where that is faster still (:func:`decide`),
with the CPU figures the ranks measured at start-up and agreed on
(:mod:`hvd_gradq.frontend.probe`), else the table. The choice reads the scheme's declaration
(``combine``) and the bytes a rank would move, never a scheme's name: a ring allreduce of B
bytes sends about 2(N-1)/N x B a rank, an allgather of payloads of C bytes receives (N-1) x C,
so gather beats an fp32 allreduce while C < 2B/N.

The hierarchical pattern's cost depends on how its pieces cross hosts, which is itself a choice
(:func:`hier_cross`): that is why the bytes and the decision share a module.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

from ..errors import SpecError
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.scheme import Combine, Scheme
from ..spec import Config, as_config
from ..wire.payload import header_size
from . import cpu_cost
from .cpu_cost import ADD_NS, Figures, cast_ns, figures_for
from .layout import chunk_bounds, lanes_for
from .pattern import CROSS, EVERY, HIERARCHICAL_ALONE, REQUESTABLE, Pattern, duration
from .second_phase import reduced_scheme

#: The link rate the cost model assumes when nobody says (Gbit/s): a common data-centre NIC.
DEFAULT_LINK_GBPS = 10.0

@dataclass(frozen=True)
class Cost:
    """Bytes a rank sends and receives for one tensor (model)."""

    sent: int
    received: int

def ring_cost(n: int, nranks: int, itemsize: int) -> Cost:
    """What a ring allreduce of ``n`` elements of ``itemsize`` bytes moves a rank: 2(N-1)/N *
    itemsize * n each way (Horovod's allreduce over Gloo, MPI and NCCL)."""
    b = round(2 * (nranks - 1) / nranks * itemsize * n)
    return Cost(b, b)

def fp32_cost(n: int, nranks: int) -> Cost:
    """What a ring allreduce of the uncompressed fp32 tensor moves: 2(N-1)/N * 4n each way."""
    return ring_cost(n, nranks, 4)

def fp16_cost(n: int, nranks: int) -> Cost:
    """What Horovod's ``Compression.fp16`` moves: the same ring at 2 bytes an element."""
    return ring_cost(n, nranks, 2)

@functools.lru_cache(maxsize=8192)
def cost(scheme: Scheme, n: int, shape_ndim: int, nranks: int, pattern: Pattern, local: int = 1,
         link_gbps: float = DEFAULT_LINK_GBPS) -> Cost:
    """Bytes one host's link carries each way for one tensor of ``n`` elements, ``nranks`` ranks
    in all, ``local`` of them a host (cached: asked every step for every tensor). With one rank a
    host this is what the rank sends and receives. (``link_gbps``: the hierarchical pattern's
    cross-host part is chosen at that rate.)"""
    hosts = nranks // local
    if pattern is Pattern.GATHER:  # ring allgather: N-1 payloads over each host's link
        c = header_size(scheme.spec, shape_ndim) + scheme.nbytes(n)
        return Cost((nranks - 1) * c, (nranks - 1) * c)
    if pattern is Pattern.SUMMABLE:  # ring allreduces of statistics and lanes
        assert isinstance(scheme, EvenLevelScheme)
        lanes = lanes_for(scheme.symbols, nranks).lanes(n)
        nb = -(-n // scheme.bucket)
        stats = 4 * nb * scheme.meta_width
        b = round(2 * (nranks - 1) / nranks * (4 * lanes + stats))
        return Cost(b, b)
    if pattern is Pattern.SCATTER:
        chunks = [hi - lo for lo, hi in chunk_bounds(n, scheme.bucket, nranks)]
        fine = reduced_scheme(scheme, nranks)
        sizes = [header_size(scheme.spec, 1) + scheme.nbytes(k) for k in chunks]
        reduced = [header_size(fine.spec, 1) + fine.nbytes(k) for k in chunks]
        # alltoall: each of the host's ranks sends the chunks of the ranks on other hosts (the
        # largest chunk stands for its own); allgather (a ring): N-1 reduced chunks over the link
        remote = (nranks - local) / max(nranks - 1, 1)
        a2a = round(local * remote * (sum(sizes) - max(sizes)))
        return Cost(a2a + (nranks - 1) * max(reduced), a2a + (nranks - 1) * max(reduced))
    if pattern is Pattern.HIERARCHICAL:  # every owner's piece, reduced among the hosts
        if hosts <= 1:
            return Cost(0, 0)
        cross = hier_cross(scheme, n, nranks, local, link_gbps)
        parts = [cost(scheme, hi - lo, 1, hosts, cross) for lo, hi in chunk_bounds(n, scheme.bucket, local)]
        return Cost(sum(c.sent for c in parts), sum(c.received for c in parts))
    raise ValueError(pattern)

def cpu_seconds(scheme: Scheme, n: int, nranks: int, pattern: Pattern, local: int = 1,
                link_gbps: float = DEFAULT_LINK_GBPS, figures: Figures | None = None) -> float:
    """What encoding, decoding and summing cost one rank for one tensor (``figures``, else the table)."""
    enc, dec = cast_ns(figures) if pattern is Pattern.FP16 else figures_for(scheme, figures)
    if pattern is Pattern.GATHER:
        ns = enc * n + (dec + ADD_NS) * (nranks - 1) * n
    elif pattern is Pattern.SUMMABLE:
        ns = (enc + dec + 2 * ADD_NS) * n  # plus packing and unpacking the lanes
    elif pattern is Pattern.SCATTER:
        fenc, fdec = figures_for(reduced_scheme(scheme, nranks), figures)
        k = n / nranks
        ns = enc * n + (dec + ADD_NS) * (nranks - 1) * k + fenc * k + fdec * (nranks - 1) * k
    elif pattern is Pattern.HIERARCHICAL:
        hosts = nranks // local
        piece = -(-n // local)
        cross = cpu_seconds(scheme, piece, hosts, hier_cross(scheme, n, nranks, local, link_gbps), 1, link_gbps,
                            figures) if hosts > 1 else 0.0
        return 2 * ADD_NS * n * 1e-9 + cross  # the host's sum and the copy back, then the cross-host part
    elif pattern is Pattern.FP16:
        ns = (enc + dec) * n
    else:
        ns = 0.0
    return ns * 1e-9

def seconds(scheme: Scheme, n: int, shape_ndim: int, nranks: int, pattern: Pattern, local: int = 1,
            link_gbps: float = DEFAULT_LINK_GBPS, figures: Figures | None = None) -> float:
    """The model's time for one tensor: the busier direction of the host's link at ``link_gbps``
    plus the rank's CPU (fp32, fp16: Horovod's rings, fp16 with its cast). No overlap and no
    latency term: it ranks patterns, it is not a forecast."""
    c = (fp32_cost(n, nranks) if pattern is Pattern.FP32 else fp16_cost(n, nranks) if pattern is Pattern.FP16
         else cost(scheme, n, shape_ndim, nranks, pattern, local, link_gbps))
    cpu = cpu_seconds(scheme, n, nranks, pattern, local, link_gbps, figures)
    return max(c.sent, c.received) * 8 / (link_gbps * 1e9) + cpu

@functools.lru_cache(maxsize=4096)
def hier_cross(scheme: Scheme, n: int, nranks: int, local: int, link_gbps: float = DEFAULT_LINK_GBPS) -> Pattern:
    """How the hierarchical pattern reduces a host's piece among the hosts: ``gather`` or
    ``scatter``, as :func:`choose` would for the piece over that many ranks."""
    hosts = nranks // local
    if hosts <= 1:
        return Pattern.GATHER
    return choose(scheme, -(-n // local), 1, hosts, Pattern.AUTO, CROSS, 1, link_gbps)

@functools.lru_cache(maxsize=8192)
def choose(
    scheme: Scheme, n: int, shape_ndim: int, nranks: int, requested: Pattern, offered: frozenset[Pattern] = EVERY,
    local: int = 1, link_gbps: float = DEFAULT_LINK_GBPS, figures: Figures | None = None,
) -> Pattern:
    """The pattern for one tensor: the requested one if the scheme allows it, else the fastest by
    :func:`seconds` (``figures`` or the table) of those the frontend ``offered`` that move fewer bytes
    than an fp32 allreduce (all of them if none does; a pattern must be 10% faster than gather to
    be taken: gather quantizes once and is the simplest on the wire). ``hierarchical`` needs
    several ranks a host; with one it is its cross-host part, which is then all of it.
    (:func:`choose_why` also says why.)"""
    return choose_why(scheme, n, shape_ndim, nranks, requested, offered, local, link_gbps, figures)[0]

@functools.lru_cache(maxsize=8192)
def choose_why(
    scheme: Scheme, n: int, shape_ndim: int, nranks: int, requested: Pattern, offered: frozenset[Pattern] = EVERY,
    local: int = 1, link_gbps: float = DEFAULT_LINK_GBPS, figures: Figures | None = None,
) -> tuple[Pattern, str]:
    """:func:`choose`'s pattern and the reason for it, as :func:`decide` words it."""
    can_sum = scheme.combine is Combine.SUMMABLE and isinstance(scheme, EvenLevelScheme)
    if requested is Pattern.SUMMABLE:
        if not can_sum:
            valid = ", ".join(p.value for p in REQUESTABLE if p is not Pattern.SUMMABLE)
            raise SpecError(
                f"{scheme.name}: pattern=summable needs evenly spaced levels shared across ranks; "
                f"this scheme declares gather. Valid here: {valid}"
            )
        return Pattern.SUMMABLE, "requested"
    if requested is Pattern.HIERARCHICAL and local <= 1:
        warnings.warn(HIERARCHICAL_ALONE, stacklevel=2)  # one text: shown once a process
        p, why = choose_why(scheme, n, shape_ndim, nranks, Pattern.AUTO, CROSS, 1, link_gbps, figures)
        return p, f"one rank a host: hierarchical is its cross-host part; {why}"
    if requested in (Pattern.GATHER, Pattern.SCATTER, Pattern.HIERARCHICAL):
        return requested, "requested"
    options = [p for p in (Pattern.GATHER, Pattern.SCATTER, Pattern.SUMMABLE, Pattern.HIERARCHICAL) if p in offered]
    options = [p for p in options if (p is not Pattern.SUMMABLE or can_sum) and (p is not Pattern.HIERARCHICAL
                                                                               or local > 1)]
    times = {}
    for p in options:
        try:
            times[p] = seconds(scheme, n, shape_ndim, nranks, p, local, link_gbps, figures)
        except SpecError:  # summable lanes that do not fit at this N
            continue
    # compression was asked for: among the patterns that move fewer bytes than an fp32 allreduce
    # (if any does), the fastest; so a CPU-cheap pattern never wins by sending more than fp32
    fp32 = fp32_cost(n, nranks).received
    smaller = {p: t for p, t in times.items()
               if cost(scheme, n, shape_ndim, nranks, p, local, link_gbps).received < fp32}
    pool = smaller or times
    best = min(pool, key=lambda p: pool[p])
    kept = Pattern.GATHER in pool and best is not Pattern.GATHER and pool[best] >= 0.9 * pool[Pattern.GATHER]
    if kept:  # a clear win only: gather quantizes once
        best, faster = Pattern.GATHER, best
    ranked = sorted(pool, key=lambda p: (p is not best, pool[p]))
    why = "auto: " + " < ".join(f"{p.value} {duration(pool[p])}" for p in ranked)
    if kept:
        why = f"auto: gather {duration(pool[best])} ({faster.value} {duration(pool[faster])} is not 10% faster)"
    why += f" at {link_gbps:g} Gbit/s"
    if len(times) == 1:
        why += " (the only pattern offered)"
    others = sorted(p.value for p in times if p not in pool)
    if others:
        why += f"; {', '.join(others)} would move no less than fp32 allreduce"
    return best, why

def reads_link(requested: Pattern) -> bool:
    """Whether :func:`decide` may choose otherwise at another link rate for a compressor asked for
    ``requested``: under ``auto`` (the modelled times) and ``hierarchical`` (how its pieces cross
    hosts, :func:`hier_cross`, also when it runs as that part alone). A pattern asked for by name
    (``gather``, ``summable``, ``scatter``) is taken as is (:func:`choose_why`: "requested"), and
    the link rate only words its reason; so ranks compare the rate where it can change a decision."""
    return requested in (Pattern.AUTO, Pattern.HIERARCHICAL)


def reads_fallback(requested: Pattern) -> bool:
    """Whether :func:`decide` reads ``fallback`` for a compressor asked for ``requested``: only
    under ``auto`` (an explicit pattern is always honoured, never sent as fp16)."""
    return requested is Pattern.AUTO


@dataclass(frozen=True)
class Choice:
    """How one tensor is reduced, whole: the pattern, how a hierarchical pattern's pieces cross
    hosts (``cross``: gather or scatter; gather for every other pattern, where it means nothing),
    and why (:attr:`why`, a tagged reason: :func:`decide`). Every driver takes the pattern's phases
    from the reduction core's table by :attr:`pattern` and hands them the whole choice."""

    pattern: Pattern
    why: str
    cross: Pattern = Pattern.GATHER


@functools.lru_cache(maxsize=8192)
def decide(
    scheme: Config | Scheme, n: int, shape_ndim: int, nranks: int, requested: Pattern,
    offered: frozenset[Pattern] = EVERY, local: int = 1, link_gbps: float = DEFAULT_LINK_GBPS,
    fallback: bool = False, figures: Figures | None = None,
) -> Choice:
    """The pattern and pass-through policy, for both frontends (as PyTorch's ``_should_compress``
    decides for its DDP hooks): how one tensor of ``n`` elements is reduced over ``nranks`` ranks,
    ``local`` of them a host, on links of ``link_gbps``.

    * :attr:`Pattern.FP32` (Horovod's own allreduce, exact) when ``requested`` is ``auto`` and the
      compressed traffic would not be smaller than an fp32 ring allreduce: tiny tensors (biases),
      where a payload header outweighs the values. An explicit pattern is always honoured.
      (Bytes, not time: a user who asked for compression gets it wherever it saves bytes.)
    * Otherwise :func:`choose` among the patterns the frontend ``offered``; then, under ``auto``
      with ``fallback`` and ``nonfinite=propagate`` (fp16 cannot raise or skip), :attr:`Pattern.FP16`
      (``Compression.fp16``, bit for bit) where that pattern's :func:`seconds` exceed fp16's.
    * ``summable`` and ``hierarchical`` with ``nonfinite=skip`` become ``gather``: skip changes a
      rank's payload on its own, which a shared-scale sum or a host's sum cannot carry.

    A frontend's one-rank reductions are its own call (PyTorch passes them through exactly;
    TensorFlow's single-process runs compress, which its unit tests rely on). ``figures``: the CPU
    figures every rank agreed on (the maximum over ranks, :mod:`hvd_gradq.frontend.probe`), so
    every rank decides alike; None: the table (:mod:`.cpu_table`). ``scheme``: a config (its
    policy's ``nonfinite`` counts), or a scheme with its default policy.

    **Why** (:attr:`Choice.why`, one line for ``stats()`` and the log): a reason that starts with
    a tag, the text before its first ``:`` (:func:`.pattern.why_tag`): ``requested``; ``auto``
    (the modelled times at the link rate, fastest first; patterns left out for moving no less
    than fp32); ``no saving`` (fp32: the chosen pattern's bytes against an fp32 ring
    allreduce's); ``fallback`` (fp16: the chosen pattern's modelled time against fp16's);
    ``nonfinite=skip``; ``one rank a host`` (hierarchical asked for with one rank a host); and,
    from the frontends, ``warm-up`` (:func:`.pattern.warmup_why`) and ``one rank``
    (:data:`.pattern.ONE_RANK_WHY`).

    **Cross.** A hierarchical choice carries how its pieces cross hosts (:func:`hier_cross`), so
    that no driver computes it again.
    """
    nonfinite = as_config(scheme).policy.nonfinite
    scheme = as_config(scheme).scheme
    p, why = choose_why(scheme, n, shape_ndim, nranks, requested, offered, local, link_gbps, figures)
    if requested is Pattern.AUTO and nranks > 1:
        moved = cost(scheme, n, shape_ndim, nranks, p, local, link_gbps).received
        fp32 = fp32_cost(n, nranks).received
        if moved >= fp32:
            return Choice(Pattern.FP32, f"no saving: {p.value} would move {moved} B a rank, fp32 allreduce {fp32} B "
                                        f"({n} elements)")
    if p in (Pattern.SUMMABLE, Pattern.HIERARCHICAL) and nonfinite is NonFinite.SKIP:
        return Choice(Pattern.GATHER,
                      f"nonfinite=skip: a rank's uncompressed tensor cannot join a {p.value} sum, so gather")
    if fallback and requested is Pattern.AUTO and nranks > 1 and nonfinite is NonFinite.PROPAGATE:
        mine = seconds(scheme, n, shape_ndim, nranks, p, local, link_gbps, figures)
        fp16 = seconds(scheme, n, shape_ndim, nranks, Pattern.FP16, local, link_gbps, figures)
        if mine > fp16:
            return Choice(Pattern.FP16, f"fallback: modelled {p.value} {duration(mine)} vs fp16 {duration(fp16)} "
                                        f"at {link_gbps:g} Gbit/s")
    if p is Pattern.HIERARCHICAL:
        return Choice(p, why, hier_cross(scheme, n, nranks, local, link_gbps))
    return Choice(p, why)


# the decisions that priced with the table (figures None) are stale once another table is in use
for _cached in (cost, hier_cross, choose, choose_why, decide):  # cost: hierarchical's cross part
    cpu_cost.on_table_change(_cached.cache_clear)
