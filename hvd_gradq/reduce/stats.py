"""What compression costs and saves, for both frontends: bytes, time and each tensor's pattern.

**Bytes** are what this rank sends and receives (payload sizes as laid on the wire, or the cost
model's figure where a frontend counts nothing at run time), set against what Horovod would move
for the same tensors at this world size: its fp32 allreduce and its ``Compression.fp16``, both
the ring model of :func:`~hvd_gradq.plan.decide.ring_cost` (2(N-1)/N x bytes a rank each
way). A tensor Horovod reduces itself (``fp32``: tiny, warm-up, one rank) counts as that ring.
With one rank nothing moves either way, and every ratio is 1.0.

**Time** is host wall time (``time.perf_counter``) around the real work, summed over tensors and
threads (:class:`Clock`): ``encode`` (quantizing and packing, own decoded values included),
``decode`` (parsing, decoding and summing received payloads), ``wait`` (blocked on a Horovod
collective) and ``compressor`` (the training thread inside ``compress()`` / ``decompress()``, what
a user would get by wrapping them). With worker threads the first three overlap backward and
each other: they are work, not step time. TensorFlow reports the same four kinds as it can
measure them in a graph (:mod:`hvd_gradq.tensorflow.telemetry`): ``encode`` and ``decode`` are
its host functions, ``wait`` the time from a payload leaving its encoder to the collective's
result reaching the decoder, ``compressor`` its host functions' time (its ``compress()`` and
``decompress()`` run once, while Horovod traces); the summable pattern's graph ops are not timed.

**Steps.** ``last_step`` is the most recent step (complete when read between steps: after
``opt.step()``, after a ``tf.function`` call returns); ``total`` everything since construction.

**Per tensor**: the pattern, why (:attr:`hvd_gradq.plan.decide.Choice.why`), elements,
ranks and the last step's bytes. :func:`flat_metrics` flattens the last step into numbers for a
tracker (``wandb.log``, TensorBoard's ``add_scalars``); :class:`Reports` gives both frontends'
compressors ``stats()`` and ``metrics()``."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..plan.decide import fp16_cost, fp32_cost
from ..plan.pattern import why_tag
from .report import table

#: Every kind of time a frontend may measure (:class:`Times`), in the order reports give them.
KINDS = ("encode", "wait", "decode", "compressor")


def ratio(reference: int, sent: int) -> float:
    """How many times fewer bytes ``sent`` is than ``reference``; 1.0 when neither moved anything."""
    if sent:
        return reference / sent
    return 1.0 if reference == 0 else float("inf")


@dataclass
class Times:
    """Seconds by kind (:data:`KINDS`)."""

    encode: float = 0.0
    wait: float = 0.0
    decode: float = 0.0
    compressor: float = 0.0

    def add(self, kind: str, seconds: float) -> None:
        setattr(self, kind, getattr(self, kind) + seconds)

    def as_dict(self, kinds: tuple[str, ...]) -> dict[str, float]:
        return {f"{k}_s": getattr(self, k) for k in kinds}


class Clock:
    """Host time by kind and step, from any thread.

    A frontend either opens each step (:meth:`open`: PyTorch, at a step's first ``compress()``)
    and adds time to the current one, or names the step of each addition (TensorFlow: a
    variable's own step counter, read in the graph, since its host calls interleave with the
    next step's mark), so that work finishing late on another thread still lands in its step."""

    def __init__(self, kinds: tuple[str, ...] = KINDS, keep: int = 4) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds of time {sorted(unknown)}; known: {KINDS}")
        self.kinds = kinds
        self.total = Times()
        self._steps: dict[int, Times] = {}
        self._current = 0  # the step open() last started
        self._named = 0  # the highest step add() was told
        self._keep = keep  # steps kept apart; older ones are dropped
        self._lock = threading.Lock()

    def open(self) -> int:
        """Start the next step; returns its number (1, 2, ...)."""
        with self._lock:
            self._current += 1
            self._steps.setdefault(self._current, Times())
            self._prune()
            return self._current

    def add(self, kind: str, seconds: float, step: int | None = None) -> bool:
        """``seconds`` of ``kind`` in ``step`` (default: the current one). True when ``step`` is
        later than any named before: the steps before it are over."""
        with self._lock:
            k = self._current if step is None else step
            newer = step is not None and step > self._named
            if newer:
                self._named = k
                self._prune()
            self._steps.setdefault(k, Times()).add(kind, seconds)
            self.total.add(kind, seconds)
            return newer

    def _prune(self) -> None:
        top = max(self._current, self._named)
        for old in [s for s in self._steps if s <= top - self._keep]:
            del self._steps[old]

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """Time the block as ``kind`` in the current step (also when it raises)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(kind, time.perf_counter() - t0)

    @property
    def steps(self) -> int:
        """The latest step opened or named."""
        with self._lock:
            return max(self._current, self._named)

    def step(self, k: int) -> Times:
        """Step ``k``'s time so far (zeros for a step no longer kept)."""
        with self._lock:
            t = self._steps.get(k)
            return Times(**vars(t)) if t is not None else Times()

    def last(self) -> Times:
        return self.step(self.steps)


@dataclass
class Tensor:
    """One tensor: how it was reduced, why, and its last step's bytes."""

    pattern: str
    why: str
    elements: int
    ranks: int
    sent: int = 0
    received: int = 0

    @property
    def fp32(self) -> int:
        return fp32_cost(self.elements, self.ranks).sent

    @property
    def fp16(self) -> int:
        return fp16_cost(self.elements, self.ranks).sent

    def as_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "why": self.why, "elements": self.elements, "ranks": self.ranks,
                "sent": self.sent, "received": self.received, "fp32": self.fp32, "fp16": self.fp16}


@dataclass
class _Counts:
    sent: int = 0
    received: int = 0
    fp32: int = 0
    fp16: int = 0
    tensors: int = 0

    def add(self, other: _Counts) -> None:
        self.sent += other.sent
        self.received += other.received
        self.fp32 += other.fp32
        self.fp16 += other.fp16
        self.tensors += other.tensors

    def as_dict(self) -> dict[str, Any]:
        vs32 = ratio(self.fp32, self.sent)
        return {"sent": self.sent, "received": self.received, "fp32": self.fp32, "fp16": self.fp16,
                "tensors": self.tensors, "vs_fp32_allreduce": vs32, "vs_fp16_allreduce": ratio(self.fp16, self.sent),
                "ratio_vs_fp32": vs32}


def _by_pattern(counts: dict[str, _Counts]) -> dict[str, Any]:
    everything = _Counts()
    for c in counts.values():
        everything.add(c)
    return {"all": everything.as_dict(), **{p: c.as_dict() for p, c in sorted(counts.items())}}


@dataclass
class Stats:
    """A compressor's figures: :meth:`decide` when a tensor's pattern is chosen, :meth:`record`
    when its bytes are known, :meth:`begin_step` at each step, time through :attr:`clock`."""

    kinds: tuple[str, ...] = KINDS
    clock: Clock = field(init=False)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    last: dict[str, _Counts] = field(default_factory=lambda: defaultdict(_Counts))
    total: dict[str, _Counts] = field(default_factory=lambda: defaultdict(_Counts))

    def __post_init__(self) -> None:
        self.clock = Clock(self.kinds)

    def begin_step(self) -> int:
        """A new step: its bytes start from zero; returns its number."""
        self.last = defaultdict(_Counts)
        return self.clock.open()

    def decide(self, key: str, pattern: str, why: str, elements: int, ranks: int) -> None:
        """Tensor ``key`` of ``elements`` goes by ``pattern`` over ``ranks`` ranks, for ``why``."""
        t = self.tensors.get(key)
        if t is None or (t.pattern, t.why, t.elements, t.ranks) != (pattern, why, elements, ranks):
            self.tensors[key] = Tensor(pattern, why, elements, ranks)

    def record(self, key: str, sent: int, received: int, steps: int = 1) -> None:
        """Tensor ``key`` (:meth:`decide` first) sent and received these bytes, ``steps`` times
        over (a frontend that counts from static sizes records a tensor's steps at once)."""
        t = self.tensors[key]
        t.sent, t.received = sent, received
        fp32, fp16 = t.fp32, t.fp16
        self.last[t.pattern].add(_Counts(sent, received, fp32, fp16, 1))
        self.total[t.pattern].add(_Counts(steps * sent, steps * received, steps * fp32, steps * fp16, steps))

    def fresh(self) -> Stats:
        """These decisions and this clock, no bytes: for a frontend that counts bytes from static
        sizes at each read (TensorFlow), without touching what another thread may be reading."""
        other = Stats(self.kinds)
        other.clock = self.clock
        other.tensors = {k: dataclasses.replace(t) for k, t in self.tensors.items()}
        return other

    def summary(self, world: dict[str, Any] | None = None, steps: int | None = None,
                time_of: int | None = None) -> dict[str, Any]:
        """Everything, JSON-able: ``world`` (what the frontend says of the run), ``steps`` (by
        default the clock's), ``last_step`` / ``total`` bytes by pattern (and ``all``), ``time``
        (seconds by kind, of step ``time_of`` or the latest, and in total) and ``tensors`` (per
        tensor: pattern, why, elements, ranks, last bytes)."""
        last = self.clock.last() if time_of is None else self.clock.step(time_of)
        return {
            "world": dict(world or {}),
            "steps": self.clock.steps if steps is None else steps,
            "last_step": _by_pattern(self.last),
            "total": _by_pattern(self.total),
            "time": {"last_step": last.as_dict(self.kinds), "total": self.clock.total.as_dict(self.kinds)},
            "tensors": {k: t.as_dict() for k, t in self.tensors.items()},
        }



class Reports:
    """``stats()``, ``summary()`` and ``metrics()``, the same for both frontends' compressors (through
    :class:`~.compressor.CompressorCore`), whose ``_telemetry`` makes the summary
    (``hvd_gradq.torch.telemetry``, ``hvd_gradq.tensorflow.telemetry``)."""

    _telemetry: Any  # the frontend's telemetry object: its summary() is stats()

    def stats(self) -> dict[str, Any]:
        """What compression cost and saved on this rank (:mod:`hvd_gradq.reduce.stats`): bytes
        sent and received, last step and in total, by pattern, against what Horovod's fp32 and
        fp16 allreduce would move; seconds encoding, waiting, decoding (and, in PyTorch, inside
        compress/decompress); per tensor the pattern and why."""
        summary: dict[str, Any] = self._telemetry.summary()
        return summary

    def metrics(self, prefix: str = "hvd_gradq/") -> dict[str, float | int]:
        """The last step's figures as a flat dict of numbers, for ``wandb.log``, TensorBoard's
        ``add_scalars`` or a print: bytes, ratios to Horovod's fp32/fp16 allreduce,
        milliseconds by kind, tensors by pattern (:func:`flat_metrics`)."""
        return flat_metrics(self.stats(), prefix)

    def summary(self) -> str:
        """:meth:`stats` as a short text table to print (:func:`hvd_gradq.reduce.report.table`):
        where the job runs, per pattern the tensors, elements, bytes a step against Horovod's
        fp32 and fp16 allreduce and why, then the time a step by kind and the bytes in total."""
        return table(self.stats())


def flat_metrics(summary: dict[str, Any], prefix: str = "hvd_gradq/") -> dict[str, float | int]:
    """The last step of a :meth:`Stats.summary` as a flat dict of numbers, keys ``prefix`` +
    ``step``, ``bytes_sent``, ``bytes_received``, ``bytes_fp32_allreduce``,
    ``bytes_fp16_allreduce``, ``vs_fp32_allreduce``, ``vs_fp16_allreduce``, ``<kind>_ms`` for
    each kind of time measured, ``tensors_<pattern>`` for each pattern used."""
    last = summary["last_step"]
    a = last["all"]
    out: dict[str, float | int] = {
        "step": summary["steps"],
        "bytes_sent": a["sent"],
        "bytes_received": a["received"],
        "bytes_fp32_allreduce": a["fp32"],
        "bytes_fp16_allreduce": a["fp16"],
        "vs_fp32_allreduce": a["vs_fp32_allreduce"],
        "vs_fp16_allreduce": a["vs_fp16_allreduce"],
    }
    for name, seconds in summary["time"]["last_step"].items():
        out[name[: -len("_s")] + "_ms"] = 1e3 * seconds
    for p, c in last.items():
        if p != "all":
            out[f"tensors_{p}"] = c["tensors"]
    return {prefix + k: v for k, v in out.items()}


def tally(tensors: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Tensors by pattern, then by the tag of their reason (:func:`hvd_gradq.plan.pattern.why_tag`)."""
    out: dict[str, dict[str, int]] = {}
    for t in tensors.values():
        tags = out.setdefault(t["pattern"], {})
        tag = why_tag(t["why"])
        tags[tag] = tags.get(tag, 0) + 1
    return out
