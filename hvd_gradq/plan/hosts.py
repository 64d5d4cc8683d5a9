"""Where ranks sit on hosts, and the link rate the cost model assumes: what the hierarchical
pattern and :func:`hvd_gradq.plan.decide.decide` need to know about the cluster.

Horovod numbers ranks host by host (``horovodrun -H a:4,b:4``: ranks 0-3 on ``a``), and its own
hierarchical allreduce needs every host to run as many ranks (``hvd.is_homogeneous()``). Both are
checked here, on every rank, from Horovod's answers; anything else is one rank a host for the
cost model and no hierarchical pattern. The answer goes into the configuration the ranks compare
at their first step, so a rank that sees the cluster differently stops every rank with an error
instead of choosing other patterns and leaving a collective half-joined.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..errors import GradqError
from .decide import DEFAULT_LINK_GBPS, reads_fallback, reads_link
from .pattern import Pattern

LINK_ENV = "HVD_GRADQ_LINK_GBPS"


@dataclass(frozen=True)
class Hosts:
    """``nranks`` ranks, ``local`` consecutive ranks a host; ``rank`` is this one."""

    nranks: int
    local: int
    rank: int

    @property
    def count(self) -> int:
        return self.nranks // self.local

    @property
    def host(self) -> int:
        return self.rank // self.local

    @property
    def local_rank(self) -> int:
        return self.rank % self.local

    def local_peers(self) -> list[int]:
        """The ranks on this host, in local-rank order (this one included)."""
        return [self.host * self.local + i for i in range(self.local)]

    def cross_peers(self) -> list[int]:
        """The ranks with this local rank on every host, in host order (this one included)."""
        return [h * self.local + self.local_rank for h in range(self.count)]


def ranks_per_host(size: int, rank: int, local_size: int, local_rank: int, cross_rank: int, homogeneous: bool) -> int:
    """``local_size`` where there are several hosts, alike, with ranks numbered host by host;
    else 1. One host counts as one rank a host: no link between hosts to save, and a user who
    asked for compression on one machine keeps it (the model knows nothing of intra-host links)."""
    if local_size <= 1 or size % local_size or not homogeneous or size == local_size:
        return 1
    if rank != cross_rank * local_size + local_rank:
        return 1
    return local_size


def layout(nranks: int, local: int, link_gbps: float, fallback: bool = False,
           requested: Pattern = Pattern.AUTO) -> str:
    """The cluster facts :func:`~hvd_gradq.plan.decide.decide` reads (and the compressor's
    ``fallback``, which it reads too), as the text both frontends add to the configuration the
    ranks compare at their first step, for a compressor asked for pattern ``requested``. The link
    rate and ``fallback`` are written only where they can change a decision
    (:func:`~hvd_gradq.plan.decide.reads_link`, :func:`~hvd_gradq.plan.decide.reads_fallback`):
    ranks that differ in a rate no decision reads (a fixed gather, summable or scatter) run. The
    rate is written exactly (``repr`` round-trips a float): rates that differ in the 7th digit
    pass a 6-digit check yet may decide a tensor's pattern differently, and a rank that takes
    another pattern than its peers leaves a collective half-joined."""
    text = f"|hosts={nranks // local}x{local}"
    if reads_link(requested):
        text += f"|link={link_gbps!r}"
    if reads_fallback(requested):
        text += f"|fallback={'on' if fallback else 'off'}"
    return text


def link_given(value: float | None = None) -> bool:
    """Whether the user gave the link rate (``link_gbps``, ``HVD_GRADQ_LINK_GBPS``); where not,
    ``auto`` measures it at the handshake (:mod:`hvd_gradq.frontend.link`)."""
    return value is not None or os.environ.get(LINK_ENV) is not None


def link_gbps(value: float | None = None) -> float:
    """The link rate for the cost model: ``value``, else ``HVD_GRADQ_LINK_GBPS``, else
    :data:`~hvd_gradq.plan.decide.DEFAULT_LINK_GBPS` (Gbit/s)."""
    source = "link_gbps"
    if value is None:
        raw = os.environ.get(LINK_ENV)
        if raw is None:
            return DEFAULT_LINK_GBPS
        source = LINK_ENV
        try:
            value = float(raw)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        shown = os.environ.get(LINK_ENV) if source == LINK_ENV else value
        raise GradqError(f"{source}={shown!r} is not a link rate: give Gbit/s as a positive number, e.g. 25")
    return float(value)
