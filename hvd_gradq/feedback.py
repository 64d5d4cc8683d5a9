"""Error feedback: the one component both frontends and every pattern use (GRACE's ``Memory``).

**The rule.** A residual ``e`` is what compression left out of a tensor: the next step sends
``x = g + e`` and keeps ``e' = x - decoded(x)`` (Seide et al. 2014; Karimireddy et al. 2019).
:class:`Memory` writes that rule once, against :class:`hvd_gradq.xp.Ops`, so PyTorch's eager
tensors and TensorFlow's graph tensors run the same arithmetic.

**Keys.** A rank's own gradient is keyed by its name (``dense/kernel:0``, ``fc.weight``). The
scatter pattern re-compresses the partial sum a rank reduced for its chunk and sends that on: its
rounding error is a second, server-side residual, keyed :func:`reduced_key` (``<name>#reduce``);
the hierarchical pattern's owner keeps its piece's as :func:`host_key` (``<name>#host``). **Owners.**
Every rank owns one chunk (scatter) or piece (hierarchical) of every tensor those patterns take, so
the one owner rule is :func:`keeps_owner_residuals`: with error feedback, every rank keeps its own.
Checkpoints keep them all.

**Where residuals live** is the frontend's :class:`Store`: a dict of tensors in PyTorch
(:class:`hvd_gradq.torch.store.TensorStore`), one ``tf.Variable`` per gradient in TensorFlow
(:class:`hvd_gradq.tensorflow.store.SlotStore`, which also remembers which rank's residual a
restored variable holds and reads another rank's as zero).

**Mixed precision.** With a loss scale S (``GradScaler``, ``LossScaleOptimizer``) the gradients
arrive multiplied by S, which changes during training. A residual kept in scaled units would be off
by the ratio after every change, so residuals are stored unscaled: ``compensate`` adds ``e * S``
and ``update`` stores ``(x - decoded) / S``. Loss scales are powers of two, so both are exact.
:meth:`Memory.begin_step` takes the step's S (a float, or a graph tensor in TensorFlow).

**Steps that did not happen.** Where ``x - decoded`` is not finite the old residual stays (a NaN
must not poison every later step). When a whole step is skipped (its reduced gradients hold
NaN/Inf on every rank, so ``GradScaler`` skips it everywhere), the residuals that step wrote
described an update that never happened: :meth:`Memory.rollback` restores them. That needs an undo
log across a step, which eager frontends have; a TensorFlow graph instead passes ``keep`` (the
elements whose reduced result is not finite) to :meth:`Memory.update`, in the same graph.

**Variants.** Which rule a tensor follows is the policy's ``ef``, a name in the registry of
:mod:`hvd_gradq.ef_rules` (``none``, ``classic``, and any registered); loss-scale units, the
non-finite guard and the undo log stay :class:`Memory`'s, the same for every variant.

**Passes.** The classic rule on CPU float32 never runs as the framework's six to eight operations
a tensor (each a parallel region of its thread pool). Where a pattern encodes this rank's whole
gradient (gather, scatter: the pattern table's ``feeds``), the encoders compensate each bucket as
they read it and write its residual from the codes they just made (:func:`hvd_gradq.kernels.encode_fed`):
compensating, the input check, the encode, the own decode and the residual are one pass, not five.
Eagerly that is :meth:`Memory.encode_fed` (the new residual into last step's spare buffer, the old
one into the undo log); in a graph the encode's host function makes it and :meth:`Memory.settle`
applies the step's masks once the result is known (:mod:`hvd_gradq.tensorflow.residuals`).
Elsewhere (the other patterns, owner residuals, a compensated value that is not finite or beyond
the scheme's range, which the policy's ``nonfinite`` decides) it is two compiled passes
(:mod:`hvd_gradq.kernels.feedback`): on NumPy views where the Ops hand them out (``host_view``:
torch on the CPU, NumPy), and in a graph (``host_op``: TensorFlow, from ``host_op_min`` elements,
below which a host op's fixed cost outweighs the framework's operations) one host op for
:meth:`Memory.compensate` and one for :meth:`Memory.update`, which also takes in the owner check of
a graph store (``read_masked``), the loss scale as a graph tensor and the step's masks (``result``'s
NaN/Inf, ``hold``), with subnormals flushed as TensorFlow's kernels do (``flushes_subnormals``).
Same bits as the rule's operations in that framework: the tests run both.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from .ef_rules import CLASSIC, NONE, Classic, NoFeedback, Rule, register_rule, rule, rules
from .kernels import feedback as fused
from .xp import Array, Ops

__all__ = ["CLASSIC", "NONE", "Classic", "Memory", "NoFeedback", "Rule", "Store", "register_rule", "rule", "rules"]
T = TypeVar("T")

REDUCED = "#reduce"
HOST = "#host"


def reduced_key(name: str) -> str:
    """The key of the scatter pattern's server-side residual of ``name``'s reduced chunk."""
    return name + REDUCED


def host_key(name: str) -> str:
    """The key of the hierarchical pattern's residual of the piece of the host's sum of ``name``
    this rank owns (its scatter part's reduced chunk is ``reduced_key(host_key(name))``)."""
    return name + HOST


def keeps_owner_residuals(ef: bool, second_phase: bool) -> bool:
    """Whether a rank keeps owner residuals (``#reduce``, ``#host``) for a tensor: with error
    feedback, under a pattern that re-quantizes a reduced part (scatter, hierarchical), always,
    since every rank owns one part. Both frontends ask this, not their stores."""
    return ef and second_phase


def parameter_of(key: str) -> str:
    """The parameter a residual key belongs to (itself, or the name before ``#host``/``#reduce``)."""
    for suffix in (REDUCED, HOST):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key


class Store(Protocol):
    """Where a frontend keeps residuals (unscaled float32, flat).

    A graph store may also offer ``read_masked(key, like)``: the residual as ``(value, mine)``, or
    None, the residual being ``value`` where the scalar bool ``mine`` holds and zero elsewhere
    (another rank's, :class:`hvd_gradq.tensorflow.store.SlotStore`), so that a host pass takes
    the choice in (``mine`` None: always ``value``)."""

    def read(self, key: str, like: Array) -> Array | None:
        """The residual of ``key`` where ``like`` lives (device, graph), or None if there is none."""
        ...

    def write(self, key: str, value: Array) -> None: ...

    def forget(self, key: str) -> None: ...


class Memory:
    """Residuals by key, through a :class:`Store`, with the loss scale and the step's undo log.

    ``undo=False`` for graph frontends, which cannot hold values across a step and use
    ``update(keep=...)`` instead of :meth:`rollback`."""

    def __init__(self, ops: Ops, store: Store, *, undo: bool = True, variant: str = CLASSIC) -> None:
        self.ops = ops
        self.store = store
        self.rule = rule(variant)
        self.scale: Any = None  # the step's loss scale: None (or 1.0) when gradients are unscaled
        self._undo: dict[str, Array | None] | None = {} if undo else None
        self._zero = ops.full((), 0.0)  # a 0-d zero: broadcasts, and torch lets it meet CUDA tensors
        # the classic rule on host arrays runs compiled where the Ops hand out host views; in a
        # graph (TensorFlow), as one host op a pass where the Ops make them (:meth:`_graph_pass`)
        classic = isinstance(self.rule, Classic)
        self._view: Callable[[Array], Any] | None = getattr(ops, "host_view", None) if classic else None
        self._op: Callable[..., Array] | None = getattr(ops, "host_op", None) if classic else None
        self._on_host: Callable[[Array], bool] = getattr(ops, "on_host", lambda a: False)
        self._op_min: Callable[[], int] = getattr(ops, "host_op_min", lambda: 0)
        self._flush = bool(getattr(ops, "flushes_subnormals", False))  # the framework's arithmetic does
        # per key, last step's residual (the framework's array), once no undo needs it: the next
        # residual is written into its memory and the same array stored again (no allocation a step;
        # nothing outside holds residuals: checkpoints and elastic commits copy them). The array
        # itself, not a NumPy view of it, is kept and stored: a tensor made from a view of a
        # tensor holds that tensor, so wrapping each step's view would chain every step's wrappers.
        self._spare: dict[str, Array] = {}

    def begin_step(self, scale: Any = None) -> None:
        """A new step: forget the undo log; ``scale`` is the step's loss scale."""
        self.scale = scale
        if self._undo is not None:
            for key, old in self._undo.items():  # the last step's old residuals: now no one's
                if old is not None:
                    self._spare[key] = old
            self._undo.clear()

    def _scaled(self) -> bool:
        return self.scale is not None and not (isinstance(self.scale, float) and self.scale == 1.0)

    def compensate(self, key: str, x: Array) -> Array:
        """``x`` plus the residual of ``key``, in the current loss scale's units (``x`` itself,
        not a copy, when there is no residual: its bits, a zero's sign included, are kept)."""
        if self._graph(x):
            stored = self._stored(key, x)
            if stored is None:
                return x
            return self._graph_pass(fused.graph_compensate, x, x=x, e=stored[0], mine=stored[1], scale=self._op_scale())
        e = self.store.read(key, x)
        if e is None:
            return x
        views = self._host(x, e)
        if views is not None:  # one compiled pass on the host (:mod:`hvd_gradq.kernels.feedback`)
            return self.ops.from_numpy(fused.compensate(views[0], views[1], self._host_scale()))
        return self.rule.compensate(x, e * self.scale if self._scaled() else e)

    def update(self, key: str, sent: Array, decoded: Array, keep: Array | None = None, *,
               result: Array | None = None, hold: Array | None = None) -> None:
        """Store ``(sent - decoded) / S`` for ``key``; the old residual (zero if none) stays where
        that is not finite, where ``keep`` (a bool mask, or None) is set, where ``result`` (the
        step's reduced tensor, or None) is not finite, and everywhere while ``hold`` (a scalar
        bool, or None: a warm-up step) is set. ``result`` and ``hold`` are a graph's: the masks
        are then made in the same host op as the residual, where there is one."""
        if self._undo is None and self._graph(sent, decoded):
            stored = self._stored(key, sent)
            old, mine = (None, None) if stored is None else stored
            self.store.write(key, self._graph_pass(fused.graph_residual, sent, sent=sent, decoded=decoded, old=old,
                                                   mine=mine, scale=self._op_scale(), keep=keep, result=result,
                                                   hold=hold))
            return
        old = self.store.read(key, sent)
        if self._undo is not None and key not in self._undo:
            self._undo[key] = old
        views = self._host(sent, decoded, old, keep) if result is None and hold is None else None
        if views is not None:  # one compiled pass, into a buffer no one else holds (_spare)
            spare = self._spare.pop(key, None)
            into = None if spare is None else self._host(spare)
            out = into[0] if into is not None and into[0].shape == views[0].shape else None
            new = fused.residual(views[0], views[1], self._host_scale(), views[3], views[2], out)
            self.store.write(key, spare if out is not None else self.ops.from_numpy(new))
            return
        e = self.rule.residual(sent, decoded)
        if self._scaled():
            e = e / self.scale
        bad = ~self.ops.isfinite(e)
        for also in (keep, None if result is None else ~self.ops.isfinite(result), hold):
            if also is not None:
                bad = bad | also
        self.store.write(key, self.ops.where(bad, self._zero if old is None else old, e))

    def fed_inputs(self, key: str, x: Array) -> tuple[Array | None, Array | None, Any] | None:
        """(``key``'s residual, whether this rank owns it, the step's scale; each None where there is
        none) for a graph's one-pass encode (:func:`hvd_gradq.tensorflow.host.fed_encoder`), or None
        where the classic rule does not run on host values (another rule, not a float32 CPU tensor)."""
        if self._op is None or not self._on_host(x):
            return None
        stored = self._stored(key, x)
        e, mine = (None, None) if stored is None else stored
        return e, mine, self._op_scale()

    def settle(self, key: str, new: Array, result: Array | None = None, hold: Array | None = None) -> None:
        """Keep ``new``, a residual a graph's one-pass encode made, as ``key``'s, with the step's
        masks of :meth:`update`: the old residual stays where ``result`` is not finite and
        everywhere while ``hold`` is set. One host op where :meth:`update`'s would be, else a select."""
        if self._graph(new):
            stored = self._stored(key, new)
            old, mine = (None, None) if stored is None else stored
            self.store.write(key, self._graph_pass(fused.graph_settle, new, new=new, old=old, mine=mine, result=result,
                                                   hold=hold))
            return
        old = self.store.read(key, new)
        bad = None if result is None else ~self.ops.isfinite(result)
        if hold is not None:
            bad = hold if bad is None else bad | hold
        self.store.write(key, new if bad is None else self.ops.where(bad, self._zero if old is None else old, new))

    def encode_fed(self, key: str, x: Array, encode: Callable[[Any, Any, float | None, Any], T | None]) -> T | None:
        """Compensate the raw gradient ``x``, encode it and keep ``key``'s new residual in one pass:
        ``encode(x, e, scale, out)`` (host views; ``e`` and ``scale`` None where there are none)
        returns what it encoded, its new residual in ``out`` (last step's spare buffer, the old
        one into the undo log, as :meth:`update`), or None. None also where the pass does not
        apply (another rule; no host views: a device's or a graph's tensors): nothing changed,
        the caller runs :meth:`compensate`, its encode and :meth:`update`."""
        if self._view is None or self._undo is None:
            return None
        old = self.store.read(key, x)
        views = self._host(x, old)
        if views is None:
            return None
        spare = self._spare.pop(key, None)
        into = None if spare is None else self._host(spare)
        out = into[0] if into is not None and into[0].shape == views[0].shape else None
        buf = np.empty_like(views[0]) if out is None else out
        got = encode(views[0], views[1], self._host_scale(), buf)
        if got is None:
            if spare is not None:
                self._spare[key] = spare
            return None
        if key not in self._undo:
            self._undo[key] = old
        self.store.write(key, spare if out is not None else self.ops.from_numpy(buf))
        return got

    def flush(self, key: str, x: Array, owned: Sequence[tuple[str, int, int]] = (), forget: bool = True) -> Array:
        """Deliver a tensor's residuals with a step that sends it uncompressed (``auto``'s
        measured plan handed it to Horovod's fp16 or fp32: :mod:`hvd_gradq.plan.trial`): ``x``
        plus ``key``'s residual, plus each owner residual ``(key, lo, hi)`` (scatter's reduced
        chunk, hierarchical's piece: :func:`hvd_gradq.reduce.table.owned`) on the slice of ``x``
        its values belong to, all in the step's loss-scale units; then the residuals are gone
        (into the undo log: a skipped step restores them). What compression left out of earlier
        steps is sent once, with this step, and never again: a tensor that returns to
        compression starts from zero. ``x`` itself (not a copy) where there is nothing to add.
        ``forget=False``: the residuals stay (a graph, which cannot undo, zeroes them once the
        step's result is known: :mod:`hvd_gradq.tensorflow.switch`)."""
        out = x
        n = self.ops.shape(x)[0]
        for k, lo, hi in ((key, 0, n), *owned):
            e = self.store.read(k, x if (lo, hi) == (0, n) else x[lo:hi])  # a store checks the size it holds
            if e is None:
                continue
            if forget and self._undo is not None and k not in self._undo:
                self._undo[k] = e
            part = e[: hi - lo]
            if (lo, hi) != (0, n):
                part = self.ops.concat([self.ops.zeros((lo,), "float32"), part,
                                        self.ops.zeros((n - hi,), "float32")], 0)
            out = out + (part * self.scale if self._scaled() else part)
            if forget:
                self.store.forget(k)
        return out

    def _graph(self, *arrays: Array) -> bool:
        """Whether the classic rule's passes run as host ops of a graph: the Ops make them (a
        graph namespace), every array is float32 on the CPU (elsewhere the framework's
        operations stay on the device), and the tensor is large enough to pay a host op's fixed
        cost (the Ops' ``host_op_min``)."""
        return (self._op is not None and self.ops.shape(arrays[0])[0] >= self._op_min()
                and all(self._on_host(a) for a in arrays))

    def _stored(self, key: str, like: Array) -> tuple[Array, Array | None] | None:
        """The residual of ``key`` as (value, mine): see :class:`Store`'s ``read_masked``."""
        masked = getattr(self.store, "read_masked", None)
        if masked is not None:
            return masked(key, like)  # type: ignore[no-any-return]
        e = self.store.read(key, like)
        return None if e is None else (e, None)

    def _op_scale(self) -> Any:
        """The step's scale as a host op's input (a graph tensor, or a float), None when unscaled."""
        return self.scale if self._scaled() else None

    def _graph_pass(self, fn: Callable[..., Any], like: Array, **inputs: Array | None) -> Array:
        """``fn(flush, **inputs)`` on the inputs' host values as one op of the graph (the Ops'
        ``host_op``), float32 of ``like``'s shape; inputs that are None stay out of the op."""
        assert self._op is not None
        names = [k for k, v in inputs.items() if v is not None]
        flush = self._flush

        def run(*values: Any) -> Any:
            return fn(flush, **dict(zip(names, values)))

        return self._op(run, [inputs[k] for k in names], self.ops.shape(like))

    def _host_scale(self) -> float | None:
        return float(self.scale) if self._scaled() else None

    def _host(self, *arrays: Array | None) -> list[Any] | None:
        """NumPy views of ``arrays`` (None stays None) sharing their memory, where every one has
        one (contiguous float32 or bool host arrays, and the Ops hand them out: torch on the CPU,
        NumPy) and the scale is a host number; else None, and the framework's operations run."""
        if self._view is None or not (self.scale is None or isinstance(self.scale, float)):
            return None
        views = [None if a is None else self._view(a) for a in arrays]
        if any(v is None for v, a in zip(views, arrays) if a is not None):
            return None
        return views

    def rollback(self) -> None:
        """Undo every residual written since :meth:`begin_step` (the step was skipped)."""
        if self._undo is None:
            raise RuntimeError("rollback needs Memory(undo=True); graph frontends pass keep= to update")
        for key, old in self._undo.items():
            if old is None:
                self.store.forget(key)
            else:
                self.store.write(key, old)
        self._undo.clear()
