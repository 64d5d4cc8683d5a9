"""Elastic Horovod (``hvd.elastic.run``): what a compressor carries across a reset, framework-free.

Horovod's elastic driver ends a world (a worker lost, hosts added or removed), shuts its core down,
starts a new one with the workers that are left or have joined, and calls the state object's
``restore()`` (after a failed step), ``sync()`` (rank 0's state to everyone; skipped when hosts were
only removed) and reset callbacks. A compressor has four kinds of state, and each follows a rule:

* **Configuration and decisions** (the rank check, ranks a host, each tensor's pattern): made again
  for the new world. Every collective name starts with the *generation* (``hvd_gradq.g3.``...), one
  more at each reset and the same on every rank (rank 0's, broadcast at ``sync()``; every survivor
  counts the same resets where Horovod skips ``sync()``), so nothing started before a reset can be
  matched with anything after it.
* **Step counters** (the random streams' positions) and the **seed**: rank 0's, broadcast at
  ``sync()``; saved at ``commit()`` and rolled back by ``restore()``.
* **Worker residuals** (error feedback on this rank's own gradient, key ``<name>``): a rank's own
  rounding error, so each surviving rank keeps its own whatever its new rank number; a rank that
  joins starts from zero (as a rank that loads another rank's checkpoint does). Saved at
  ``commit()``, rolled back by ``restore()``, so a step that failed half-way leaves nothing.
* **Owner residuals** (the scatter pattern's ``<name>#reduce``, the hierarchical pattern's
  ``<name>#host`` and ``<name>#host#reduce``): the rounding error of the chunk or host piece this
  rank *owned*, which follows the world's size, this rank's place and the ranks a host. They are kept
  when the new world is the one they were made in, and otherwise **dropped** (a one-step bias on
  those chunks, then error feedback resumes), with one log line saying how many and why. Re-splitting
  them would hand one owner's error to another rank, whose chunk bounds no longer match.

:func:`carry_over` is that rule, written once; the frontends' adapters
(:mod:`hvd_gradq.torch.elastic`, :mod:`hvd_gradq.tensorflow.elastic`) call it and own only the
copying and broadcasting.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..feedback import parameter_of

#: Horovod's launcher sets this to 1 in every worker of an elastic job.
ENV = "HOROVOD_ELASTIC"

logger = logging.getLogger("hvd_gradq")


def active() -> bool:
    """Whether this process is a worker of an elastic Horovod job (``horovodrun`` with
    ``--min-np``/``--max-np``/``--host-discovery-script``): the one check both frontends use."""
    return os.environ.get(ENV, "0").strip() not in ("", "0")


@dataclass(frozen=True)
class World:
    """What a compressor's decisions and owner residuals depend on: the ranks, this rank's place
    and the ranks a host (:func:`hvd_gradq.plan.hosts.ranks_per_host`'s inputs)."""

    size: int
    rank: int
    local_size: int
    local_rank: int
    cross_rank: int

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.size} ({self.local_size} a host)"


def world_of(hvd: Any) -> World:
    """Horovod's world as this rank sees it now (``hvd``: ``horovod.torch`` or ``horovod.tensorflow``)."""
    return World(hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank(), hvd.cross_rank())


def agree(hvd: Any, name: str, generation: int, steps: dict[str, int], seed: int) -> tuple[int, dict[str, int], int]:
    """What every rank takes after a reset: rank 0's generation + 1, step counters and seed
    (``hvd.broadcast_object`` of either frontend, named ``name``); one warning where this rank's
    seed differed from rank 0's."""
    number, steps0, seed0 = hvd.broadcast_object((generation + 1, steps, seed), root_rank=0, name=name)
    if seed0 != seed:
        logger.warning("elastic sync: this rank's seed %d differs from rank 0's; using %d", seed, seed0)
    return int(number), {str(k): int(v) for k, v in steps0.items()}, int(seed0)


def is_owner_key(key: str) -> bool:
    """Whether ``key`` is an owner residual (``#reduce``, ``#host``...) rather than a worker's."""
    return parameter_of(key) != key


def carry_over(keys: Iterable[str], made_in: World | None, now: World) -> tuple[list[str], list[str]]:
    """(kept, dropped) residual keys when residuals made in world ``made_in`` (None: unknown, a
    fresh compressor) meet world ``now``: worker residuals always stay; owner residuals stay only
    in the world they were made in."""
    kept: list[str] = []
    dropped: list[str] = []
    for k in keys:
        (dropped if is_owner_key(k) and made_in is not None and made_in != now else kept).append(k)
    return kept, dropped


def log_carry_over(dropped: list[str], kept: list[str], made_in: World | None, now: World) -> None:
    """The one log line of a reset that changed the world, saying what :func:`carry_over` did."""
    if made_in is None or made_in == now:
        return
    workers = sum(not is_owner_key(k) for k in kept)
    if dropped:
        logger.info("elastic reset, %s -> %s: dropped %d owner residual(s) (scatter/hierarchical "
                    "chunks follow the world; they restart from zero), kept %d worker residual(s) of this rank",
                    made_in, now, len(dropped), workers)
    else:
        logger.info("elastic reset, %s -> %s: kept %d worker residual(s) of this rank",
                    made_in, now, workers)


@dataclass
class Generation:
    """The reset count a compressor's collective names carry, and the world it was agreed in.

    ``number`` is 0 outside elastic jobs (names unchanged); :meth:`prefix` is the part it adds to
    every collective name."""

    number: int = 0
    world: World | None = None  # the world of the last reset seen (None: none yet)

    def prefix(self) -> str:
        return f"g{self.number}." if self.number else ""
