"""The one naming rule of hvd_gradq's own collectives, and of the seeds of their draws.

Horovod matches collectives across ranks by name: every rank must give a tensor's phase the same
name, and no two tensors or phases may share one while both are in flight. Both frontends name
every collective with :func:`collective`::

    hvd_gradq.<scope><kind>.<tensor>

``scope`` keeps compressors and process sets apart (PyTorch: the process set's key, empty for the
global set; TensorFlow: the compressor's id and a dot), ``kind`` names the phase (:class:`Kind`),
``tensor`` the gradient (PyTorch: the parameter's name; TensorFlow: the slot's key and the process
set's suffix).

The draws of a rank's rounding noise for one tensor at one step come from one rule,
:func:`stream` then :func:`hvd_gradq.xp.step_words`: the stream is fixed when the tensor is
first seen (base seed, rank, the tensor's key: its name, ``<name>#<j>`` for chunk j of the
scatter pattern, ``<name>#reduce`` for its reduced chunk, ``<name>#host...`` for the hierarchical
pattern's pieces) and the step is mixed in last, with the same 32-bit hash as the draws, so a
TensorFlow graph computes the words from a step counter it holds in a variable and PyTorch from
a Python int, with the same bits.
"""

from __future__ import annotations

import enum
import functools
import zlib
from dataclasses import dataclass

from ..xp import Array, Ops, step_words, step_words_int, stream_seed

PREFIX = "hvd_gradq."


class Kind(str, enum.Enum):
    """The phase a collective carries (one or two letters, to keep names short)."""

    GATHER = "g"  #: the gather pattern's payloads (allgather)
    STATS = "s"  #: the summable pattern's per-bucket statistics (Max-allreduce)
    LANES = "l"  #: the summable pattern's packed codes (Sum-allreduce)
    ALLTOALL = "a"  #: the scatter pattern's chunk payloads (alltoall)
    REDUCED = "r"  #: the scatter pattern's reduced chunks (allgather)
    HIER = "h"  #: the hierarchical pattern's phases (``h1`` ... ``h4``)
    VERDICT = "c"  #: what every rank found wrong with the bytes it received (:mod:`hvd_gradq.reduce.integrity`)
    STEP_VERDICT = "cs"  #: the same, once a step and process set (PyTorch: :mod:`hvd_gradq.reduce.verdicts`)
    STEP_STOP = "xs"  #: the barrier ranks pass before raising a step's verdict (:mod:`hvd_gradq.reduce.verdicts`)
    FUSED = "f"  #: one alltoall carrying a round's fusable alltoalls of every tensor (``f0``, ``f1``...: PyTorch)
    STOP = "x"  #: the barrier ranks pass before raising a stop on a gradient (:func:`hvd_gradq.reduce.core.halt`)
    WARM = "w"  #: a warm-up step's exact sum (TensorFlow's, inside its branch)
    PLAN = "p"  #: a measured plan's Horovod allreduce, ``p16`` / ``p32`` (TensorFlow's, inside its branch)
    VALUE = "v"  #: TensorFlow elastic's eager reduction of Horovod's [1.0]
    CONFIG = "config"  #: the one-time configuration check (allgather; its name never changes: handshake.py)
    CONFIG_TEXT = "configtext"  #: the whole configuration texts, where the ranks' digests differ (allgather)
    CPU = "cpu"  #: the start-up codec figures (allgather)
    LINK = "link"  #: the start-up link measurement's payloads and times (allgather: :mod:`hvd_gradq.frontend.link`)
    TRIAL = "trial"  #: ``auto``'s measured step times, maximum over ranks (allgather: :mod:`hvd_gradq.plan.trial`)
    RESUME = "resume"  #: the first step's check of the step counters, and ``broadcast_state()`` (PyTorch)


def collective(scope: str, kind: Kind | str, tensor: str = "", phase: int | None = None) -> str:
    """The name of one collective: ``hvd_gradq.<scope><kind>[<phase>][.<tensor>]``."""
    k = kind.value if isinstance(kind, Kind) else kind
    return f"{PREFIX}{scope}{k}{'' if phase is None else phase}{'.' + tensor if tensor else ''}"


def tensor_key(name: str) -> int:
    """A stable 32-bit key for a tensor name (the same on every rank and every run)."""
    return zlib.crc32(name.encode())


@functools.lru_cache(maxsize=1 << 16)  # asked for every tensor of every step: one hash chain a stream
def stream(base: int, rank: int, tensor: str) -> int:
    """The random stream of ``tensor`` (its key, as the module docstring lists them) on ``rank``."""
    return stream_seed(base, rank, tensor_key(tensor))


def words(base: int, rank: int, tensor: str, step: int) -> tuple[int, int]:
    """The two seed words of ``tensor``'s draws on ``rank`` at ``step``, on the host (what a
    TensorFlow graph computes with ``step_words(TF, stream(...), step_counter)``)."""
    return step_words_int(stream(base, rank, tensor), step)


@dataclass(frozen=True)
class Streams:
    """The streams of one tensor on one rank: ``streams(tag)`` is its part ``tag``'s (``"#3"``,
    ``"#reduce"``, ``"#host#1"``...), ``streams()`` the whole tensor's."""

    base: int
    rank: int
    tensor: str

    def __call__(self, tag: str = "") -> int:
        return stream(self.base, self.rank, self.tensor + tag)

    def words(self, ops: Ops, step: Array, tag: str = "") -> tuple[Array, Array]:
        """The seed words of part ``tag`` at ``step`` (a step counter of ``ops``, e.g. in a graph)."""
        return step_words(ops, self(tag), step)
