"""A Horovod ``Compressor`` for ``horovod.tensorflow`` that is real on the wire, built in the graph.

Horovod (0.28.1) calls ``compress()`` / ``decompress()`` while it traces the gradient reduction
(``DistributedGradientTape``, ``horovod.tensorflow.keras.DistributedOptimizer``; even eager tapes
are reduced inside a ``tf.function`` Horovod makes), each inside ``tf.cond(size() > 1, reduce,
identity)``. Everything here is therefore TF ops, and the schemes' shared mathematics runs on
:class:`~hvd_gradq.tensorflow.ops.TFOps` inside the graph, bit-identical to the NumPy reference.

**Identity.** No name reaches a compressor, and gradient op names are no help (eager tapes and
Keras hand Horovod placeholders ``grads``, ``grads_1``...). The key of a gradient is its position
among the ``compress()`` calls made while tracing one function graph: the graph being built,
found by walking ``outer_graph`` up out of ``tf.cond`` / ``tf.while_loop`` branch graphs (Horovod
wraps every gradient in a ``tf.cond``). Each new function graph (a retrace; the second trace
``tf.function`` makes after variables were created; Horovod's nested ``allreduce_grads``
function under Keras) counts from 0. Horovod reduces the gradients in ``var_list`` order, the
same on every rank and in every trace of the same training function, so position ``i`` always
means the same variable. A slot remembers the shape and dtype it was made for and a mismatch
raises: use one compressor per model / gradient list (two tapes in one ``tf.function`` are fine:
their calls count on in the same graph).
Collective names are ``hvd_gradq.<name>.<kind><i>``, identical on every rank; ``<name>`` is
``name=`` or ``c<k>`` for the k-th compressor this process built, which ``check_ranks`` compares.

**State.** Per slot, created once (under ``tf.init_scope``, on the trace that first reaches it):
an int64 step counter (the random stream's position: draws are seeded by base seed, rank, slot
and step) and, with ``ef``, the float32 residual. They are ``tf.Variable`` s tracked by this
``tf.Module`` (``steps/i``, ``residuals/i``), so ``tf.train.Checkpoint(compressor=...)`` saves
and restores them; restores made before the first trace are applied when the slot is created.
The Python side (shapes, patterns, byte costs) is rebuilt by tracing; ``stats()`` multiplies the
static per-step bytes of each slot by its step counter, so nothing is counted in the graph.

**Patterns.** ``gather``: encode, lay the payload bytes (header static per shape and spec, the
checksum a weighted int64 byte sum) and ``hvd.allgather`` the uint8 payload; ``decompress``
checks every payload's header and checksum and decodes all of them, its own included, in rank
order from the gathered bytes (every rank runs one computation on the same bytes), sums and
scales; with ``ef`` the residual is set from its own decoded payload there. ``summable``
(evenly spaced levels): a Max-allreduce of per-bucket statistics fixes a shared table, codes are
packed into int32 lanes and Sum-allreduced. Horovod's own allreduce carries a float32 ``[1.0]``
that reads 1 after ``op=Average`` and N after ``op=Sum``. Under ``pattern=auto``, a tensor whose
compressed traffic would not be below a plain fp32 ring allreduce (a bias of a few elements)
is handed to Horovod's allreduce unchanged, as the PyTorch frontend does; Horovod's tensor
fusion makes that sum's order (and so its bits, beyond 2 ranks) depend on what it fused: set
``HOROVOD_FUSION_THRESHOLD=0`` or ``pattern=gather`` where runs must reproduce bit for bit
(ranks agree either way). The PyTorch frontend's scatter-reduce pattern is not implemented here.
The mathematics runs in :mod:`hvd_gradq.tensorflow.codec` functions, traced once per
(scheme, size) and shielded from Grappler's float rewrites.

**Not compressed.** ``tf.IndexedSlices`` (embeddings) never reach ``compress()``: Horovod
allgathers their values and indices itself, unless ``sparse_as_dense=True``. With
``nonfinite=raise`` (default) a NaN/Inf on any rank stops the step on every rank with an
``InvalidArgumentError`` that says so (a graph cannot raise Python errors on values; the rank
with NaN still takes part in the collective, with a poison payload or +inf statistics, so that no
rank waits for it); ``nonfinite=skip`` is refused (payload sizes are fixed
when the graph is traced); ``propagate`` sends NaN buckets. Errors raised while tracing
(a rank mismatch, a slot mismatch) surface as AutoGraph ``StagingError`` s carrying the message
when the caller was converted by AutoGraph.
"""
from __future__ import annotations

import hashlib
import itertools
import re
import weakref
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, cast

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..errors import GradqError
from ..frontend import codec as codec_host
from ..frontend.patterns import Pattern, choose, cost, fp32_cost, parse_pattern
from ..frontend.stats import Stats
from ..payload import CHECK_OFFSET, DTYPE_CODES, MAX_NDIM, header_bytes, header_size
from ..schemes.base import Combine, EvenLevelScheme, LevelScheme, NonFinite, Scheme
from ..xp import stream_seed
from . import codec
from .ops import TF, step_words

_MOD = 65521
_COUNTER = itertools.count()
_NAME_OK = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_F = TypeVar("_F", bound=Callable[..., Any])


def _no_convert(f: _F) -> _F:
    """Keep AutoGraph out of hvd_gradq's code (plain Python control flow on static values)."""
    return cast(_F, tf.autograph.experimental.do_not_convert(f))


@dataclass
class _Slot:
    """What one gradient position holds: static facts and its variables."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    n: int
    pattern: Pattern | None  # None: a tiny tensor passed to Horovod's own allreduce as it is
    step: Any  # tf.Variable int64 scalar
    residual: Any  # tf.Variable float32 (n,) or None
    sent: int  # bytes a rank sends per reduction (model: gather is exact, ring is 2(N-1)/N)
    received: int
    fp32: int


@dataclass
class _Ctx:
    slot_index: int
    shape: tuple[int, ...]
    dtype: Any
    n: int
    pattern: Pattern | None
    result: Any = None  # gathered bytes (gather) or summed int32 lanes (summable)
    meta: Any = None  # the shared meta (summable)
    x: Any = None  # the compressed input g + e (gather with ef: the residual is set in decompress)
    residual: Any = None
    finite: Any = None  # nonfinite=raise: whether this rank's x held no NaN/Inf (a bool tensor)
    what: str = ""  # "gradient #i [shape]" for messages


class _Host:
    """Python-side bookkeeping, kept out of TF's object tracking."""

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        # compress() calls so far in each function graph being traced
        self.positions: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.eager_calls = 0
        self.checked = False


class GradqCompressor(tf.Module):  # type: ignore[misc]
    """Compress gradients with a hvd_gradq scheme inside Horovod's TensorFlow reductions.

    Args:
        scheme: the scheme (``hvd_gradq.parse("orq:levels=5")``).
        seed: base seed of the rounding noise; draws differ across ranks, steps and tensors.
        pattern: ``auto`` (cost model), ``gather`` or ``summable``.
        check_ranks: at the first trace, allgather the configuration (eagerly) and raise
            RankMismatchError on every rank if they disagree.
        name: the collectives' name prefix (letters, digits, ``_.-``); default ``c<k>`` for the
            k-th compressor built in this process (same on every rank when they build the same).
        verify: check every received payload's header and checksum inside the graph (a failed
            check stops the step with ``InvalidArgumentError``).
    """

    def __init__(
        self,
        scheme: Scheme,
        *,
        seed: int = 0,
        pattern: str | Pattern = "auto",
        check_ranks: bool = True,
        name: str | None = None,
        verify: bool = True,
    ) -> None:
        super().__init__(name="hvd_gradq_compressor")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise GradqError(f"seed must be an integer, not {type(seed).__name__}")
        if scheme.nonfinite is NonFinite.SKIP:
            raise GradqError(
                f"{scheme.name}: nonfinite=skip is not supported by hvd_gradq.tensorflow: it changes a "
                "payload's size at run time, and a TF graph's allgather sizes are fixed when it is traced. "
                "Valid here: nonfinite=raise (the step fails) or nonfinite=propagate (NaN buckets)"
            )
        if scheme.nonfinite is NonFinite.PROPAGATE and not isinstance(scheme, LevelScheme):
            raise GradqError(f"{scheme.name}: nonfinite=propagate is supported by level schemes only; use raise")
        cid = name if name is not None else f"c{next(_COUNTER)}"
        if not _NAME_OK.match(cid):
            raise GradqError(f"name={cid!r} is not valid: 1-64 letters, digits, '_', '.' or '-'")
        self.scheme = scheme
        self._math = scheme.replace(ef=False) if scheme.ef else scheme  # what the encoders depend on
        self.seed = seed
        self.pattern = parse_pattern(pattern)
        if self.pattern is Pattern.SUMMABLE:
            choose(scheme, 1, 1, 2, Pattern.SUMMABLE)  # refuse now, not at the first step
        if self.pattern is Pattern.SCATTER:
            raise GradqError(
                "pattern=scatter (scatter-reduce + allgather) is implemented by hvd_gradq.torch only; "
                "valid in hvd_gradq.tensorflow: auto, gather, summable"
            )
        self.check_ranks = check_ranks
        self.verify = verify
        self.cid = cid
        self.steps: list[Any] = []  # tracked: checkpoint keys steps/<i>
        self.residuals: list[Any] = []  # tracked: residuals/<i> (ef only)
        self._host = _Host()

    # -- configuration ---------------------------------------------------------------------------
    def config(self) -> str:
        """What every rank must agree on."""
        return f"{self.scheme.spec}|pattern={self.pattern.value}|seed={self.seed}|name={self.cid}|tf|v=1"

    def digest(self) -> str:
        return hashlib.sha256(self.config().encode()).hexdigest()[:16]

    def _check_ranks(self) -> None:
        self._host.checked = True
        if not self.check_ranks or hvd.size() == 1:
            return
        with tf.init_scope():  # runs now, eagerly, even while a graph is being traced
            mine = self.config().encode()
            lens = hvd.allgather(tf.constant([len(mine)], tf.int64), name="hvd_gradq.tfconfig.len",
                                 ignore_name_scope=True)
            allb = hvd.allgather(tf.constant(np.frombuffer(mine, np.uint8)), name="hvd_gradq.tfconfig",
                                 ignore_name_scope=True)
            lens_np, allb_np = lens.numpy(), allb.numpy()
        codec_host.check_configs(lens_np.tolist(), allb_np)

    # -- identity ------------------------------------------------------------------------------
    @staticmethod
    def _function_graph() -> Any:
        """The graph of the function being traced: the default graph, or, inside ``tf.cond`` /
        ``tf.while_loop`` branches, the function graph they belong to."""
        g = tf.compat.v1.get_default_graph()
        while _is_control_flow_graph(g):
            g = g.outer_graph
        return g

    def _pattern_for(self, n: int, ndim: int) -> Pattern | None:
        """The pattern of a tensor of ``n`` elements; None: pass it to Horovod's own allreduce.

        As in the PyTorch frontend: with ``pattern=auto``, a tensor whose compressed traffic
        would not be smaller than a plain fp32 ring allreduce (a bias of a few elements: the
        payload header alone outweighs it) goes uncompressed, exactly; ``nonfinite=propagate``
        uses gather (a rank's NaN buckets are its own). The scatter-reduce pattern of the
        PyTorch frontend is not implemented here: where the cost model prefers it, the cheaper
        of gather and summable is used.
        """
        size = hvd.size()
        p = choose(self.scheme, n, ndim, size, self.pattern)
        if p is Pattern.SCATTER:
            p = Pattern.GATHER
            if isinstance(self.scheme, EvenLevelScheme) and self.scheme.combine is Combine.SUMMABLE:
                try:
                    s = cost(self.scheme, n, ndim, size, Pattern.SUMMABLE).received
                    if s < 0.9 * cost(self.scheme, n, ndim, size, Pattern.GATHER).received:
                        p = Pattern.SUMMABLE
                except GradqError:
                    pass
        if (self.pattern is Pattern.AUTO and size > 1
                and cost(self.scheme, n, ndim, size, p).received >= fp32_cost(n, size).received):
            return None
        if p is Pattern.SUMMABLE and self.scheme.nonfinite is not NonFinite.RAISE:
            p = Pattern.GATHER
        return p

    def _slot(self, tensor: Any, shape: tuple[int, ...], dtype: str) -> _Slot:
        """The slot of this gradient: by its position among this trace's compress() calls."""
        h = self._host
        g = self._function_graph()
        i = h.positions.get(g, 0)
        h.positions[g] = i + 1
        if i < len(h.slots):
            s = h.slots[i]
            if s.shape != shape or s.dtype != dtype:
                raise GradqError(
                    f"gradient #{i} of this trace has shape {list(shape)} ({dtype}); the compressor's slot "
                    f"#{i} was made for {list(s.shape)} ({s.dtype}). hvd_gradq.tensorflow keys state by the "
                    "order of gradients in a training function: use one compressor per model / gradient list"
                )
            return s
        return self._new_slot(i, shape, dtype)

    def _new_slot(self, i: int, shape: tuple[int, ...], dtype: str) -> _Slot:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        size = hvd.size()
        pattern = self._pattern_for(n, len(shape))
        c = cost(self.scheme, n, len(shape), size, pattern) if size > 1 and pattern else fp32_cost(n, size)
        with tf.init_scope():
            step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"hvd_gradq_step_{i}")
            residual = None
            if self.scheme.ef:
                residual = tf.Variable(tf.zeros((n,), tf.float32), trainable=False, name=f"hvd_gradq_residual_{i}")
        self.steps.append(step)
        if residual is not None:
            self.residuals.append(residual)
        slot = _Slot(i, shape, dtype, n, pattern, step, residual, c.sent, c.received, fp32_cost(n, size).sent)
        self._host.slots.append(slot)
        return slot

    # -- Horovod's interface -------------------------------------------------------------------
    @_no_convert
    def compress(self, tensor: Any) -> tuple[Any, Any]:
        if isinstance(tensor, tf.IndexedSlices):  # Horovod allgathers these itself
            return tensor, None
        tensor = tf.convert_to_tensor(tensor)
        if not tensor.dtype.is_floating:
            raise GradqError(f"hvd_gradq compresses floating-point gradients, not {tensor.dtype.name}")
        dtype = tensor.dtype.name
        if dtype not in DTYPE_CODES:
            raise GradqError(f"gradient dtype {dtype} is not supported; valid: {', '.join(DTYPE_CODES)}")
        shape = TF.shape(tensor)
        if len(shape) > MAX_NDIM:
            raise GradqError(f"a gradient of {len(shape)} dimensions; at most {MAX_NDIM}")
        if not self._host.checked:
            self._check_ranks()
        eager = tf.executing_eagerly()
        if eager:
            if self.scheme.ef:
                raise GradqError(
                    "error feedback needs to know which variable a gradient belongs to, and an eager "
                    "hvd.allreduce(t, compression=...) does not say: reduce gradients with "
                    "DistributedGradientTape / DistributedOptimizer (Horovod traces those) or inside a tf.function"
                )
            key = f"e{self._host.eager_calls}"
            step: Any = self._host.eager_calls
            self._host.eager_calls += 1
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            pattern = self._pattern_for(n, len(shape))
            index, residual, stream = -1, None, stream_seed(self.seed, hvd.rank(), 1 << 40)
        else:
            slot = self._slot(tensor, shape, dtype)
            key, n, pattern, residual, index = f"{slot.index}", slot.n, slot.pattern, slot.residual, slot.index
            step = slot.step.assign_add(1, read_value=True) - 1
            stream = stream_seed(self.seed, hvd.rank(), slot.index)
        ctx = _Ctx(index, shape, tensor.dtype, n, pattern)
        if pattern is None:  # fp32 pass-through (Horovod's TF allreduce has no bfloat16: sent as fp32)
            return (tf.cast(tensor, tf.float32) if tensor.dtype == tf.bfloat16 else tensor), ctx
        one = tf.ones((1,), tf.float32)
        if n == 0:
            return one, ctx
        x = tf.reshape(tf.cast(tensor, tf.float32), (n,))
        if residual is not None:
            x = x + residual.read_value()
        words: Any = step_words(TF, stream, step)
        ctx.what = f"gradient #{key} {list(shape)}"
        if self.scheme.nonfinite is NonFinite.RAISE:
            # Failing here, before the collective, would leave the other ranks waiting for this
            # rank's payload forever. Instead the collective goes ahead with a signal (a poison
            # payload, or +inf statistics) and every rank fails after it, with the same message.
            ctx.finite = tf.reduce_all(tf.math.is_finite(x))
            x = tf.where(ctx.finite, x, tf.zeros_like(x))
        if pattern is Pattern.GATHER:
            self._gather_start(x, words, key, ctx)
            ctx.x, ctx.residual = x, residual
        else:
            own = self._summable_start(x, words, key, ctx)
            if residual is not None:
                residual.assign(x - own)
        return one, ctx

    def _gather_start(self, x: Any, words: Any, key: str, ctx: _Ctx) -> None:
        body = codec.body_encoder(self._math, ctx.n)(x, words[0], words[1])
        payload = self._payload(body, ctx)
        if ctx.finite is not None:
            # all zeros, no magic: the same size as a payload (allgather shapes are traced)
            payload = tf.where(ctx.finite, payload, tf.zeros_like(payload))
        ctx.result = hvd.allgather(payload, name=f"hvd_gradq.{self.cid}.g{key}", ignore_name_scope=True)

    def _header(self, ctx: _Ctx) -> tuple[bytes, int]:
        spec = self.scheme.spec
        total = header_size(spec, len(ctx.shape)) + self.scheme.nbytes(ctx.n)
        return header_bytes(spec, ctx.dtype.name, ctx.shape, total), total

    def _payload(self, body: Any, ctx: _Ctx) -> Any:
        """The payload bytes (uint8), as :meth:`hvd_gradq.Payload.to_array` lays them out: the
        header is a constant for this shape, dtype and spec; the checksum is computed here."""
        head, total = self._header(ctx)
        hl = len(head)
        hw = (np.arange(hl, dtype=np.int64) % _MOD) + 1
        hsum = int(np.dot(np.frombuffer(head, np.uint8).astype(np.int64), hw))
        bw = tf.math.floormod(tf.range(hl, total, dtype=tf.int64), _MOD) + 1
        check = tf.bitwise.bitwise_and(hsum + tf.reduce_sum(tf.cast(body, tf.int64) * bw), 0xFFFFFFFF)
        cb = tf.cast(tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(check, tf.constant([0, 8, 16, 24], tf.int64)), 0xFF), tf.uint8)
        hb = np.frombuffer(head, np.uint8)
        return tf.concat([tf.constant(hb[:CHECK_OFFSET]), cb, tf.constant(hb[CHECK_OFFSET + 4 :]), body], 0)

    def _summable_start(self, x: Any, words: Any, key: str, ctx: _Ctx) -> Any:
        scheme = self._math
        assert isinstance(scheme, EvenLevelScheme)
        size = hvd.size()
        stats = codec.shared_stats(scheme, ctx.n)(x)
        if ctx.finite is not None:  # a rank with NaN/Inf sends +inf statistics: every rank sees it
            stats = tf.where(ctx.finite, stats, tf.fill(tf.shape(stats), float("inf")))
        stats = hvd.allreduce(stats, op=hvd.Max, name=f"hvd_gradq.{self.cid}.s{key}", ignore_name_scope=True)
        if ctx.finite is not None:
            stats = tf.debugging.assert_all_finite(stats, self._nonfinite_message(ctx))
        lanes, meta, own = codec.lane_encoder(scheme, ctx.n, size)(x, stats, words[0], words[1])
        ctx.meta = meta
        ctx.result = hvd.allreduce(lanes, op=hvd.Sum, name=f"hvd_gradq.{self.cid}.l{key}", ignore_name_scope=True)
        return own

    @_no_convert
    def decompress(self, tensor: Any, ctx: Any) -> Any:
        if ctx is None:  # IndexedSlices pass through untouched
            return tensor
        if not isinstance(ctx, _Ctx):
            raise GradqError("decompress() got a context hvd_gradq did not make")
        if ctx.pattern is None:
            return tf.cast(tensor, ctx.dtype)
        if ctx.n == 0:
            return tf.zeros(ctx.shape, ctx.dtype)
        size = hvd.size()
        averaged = tf.reshape(tensor, (-1,))[0] < 1.5
        if ctx.pattern is Pattern.GATHER:
            out = self._gather_finish(ctx, size)
        else:
            scheme = self._math
            assert isinstance(scheme, EvenLevelScheme)
            out = codec.lane_decoder(scheme, ctx.n, size)(ctx.result, ctx.meta)
        out = out / tf.where(averaged, tf.constant(float(size), tf.float32), tf.constant(1.0, tf.float32))
        return tf.cast(tf.reshape(out, ctx.shape), ctx.dtype)

    def _gather_finish(self, ctx: _Ctx, size: int) -> Any:
        head, total = self._header(ctx)
        rows = tf.reshape(ctx.result, (size, total))
        if ctx.finite is None:
            return self._gather_decode(ctx, size, rows)
        magic = tf.constant(np.frombuffer(head[:4], np.uint8))
        poisoned = tf.reduce_any(tf.not_equal(rows[:, :4], magic[None, :]))

        def fail() -> Any:  # a rank sent the all-zero poison payload: it had NaN/Inf
            with tf.control_dependencies([tf.debugging.Assert(False, [self._nonfinite_message(ctx)])]):
                return tf.zeros((ctx.n,), tf.float32)

        # a cond: only the taken branch runs, so the checksum check cannot fail first
        return tf.cond(poisoned, fail, lambda: self._gather_decode(ctx, size, rows))

    def _gather_decode(self, ctx: _Ctx, size: int, rows: Any) -> Any:
        """Every rank's payload rows (size, total) decoded and summed in rank order."""
        head, total = self._header(ctx)
        deps = [self._verify(rows, head, total, ctx)] if self.verify else []
        with tf.control_dependencies(deps):
            bodies = rows[:, len(head) :]
        # Every payload, this rank's own included, is decoded from the gathered bytes by the
        # same ops in rank order: every rank runs one computation on the same bytes.
        out, own = codec.body_decoder(self._math, ctx.n, size, hvd.rank())(bodies)
        if ctx.residual is not None:
            ctx.residual.assign(ctx.x - own)
        return out

    @staticmethod
    def _nonfinite_message(ctx: _Ctx) -> str:
        return (f"hvd_gradq: {ctx.what}: non-finite values (NaN/Inf) in this gradient on at least one rank "
                "(nonfinite=raise, checked on every rank); set nonfinite=propagate to send NaN buckets instead")

    def _verify(self, rows: Any, head: bytes, total: int, ctx: _Ctx) -> Any:
        """An assertion that every gathered payload has the expected header and checksum."""
        hb = np.frombuffer(head, np.uint8).astype(np.int64)
        keep = np.ones(len(head), bool)
        keep[CHECK_OFFSET : CHECK_OFFSET + 4] = False
        r64 = tf.cast(rows, tf.int64)
        head_ok = tf.reduce_all(tf.equal(tf.boolean_mask(r64[:, : len(head)], keep, axis=1), hb[keep][None, :]))
        w = (np.arange(total, dtype=np.int64) % _MOD) + 1
        w[CHECK_OFFSET : CHECK_OFFSET + 4] = 0
        sums = tf.bitwise.bitwise_and(tf.reduce_sum(r64 * tf.constant(w), axis=1), 0xFFFFFFFF)
        stored = tf.reduce_sum(r64[:, CHECK_OFFSET : CHECK_OFFSET + 4]
                               * tf.constant([1, 1 << 8, 1 << 16, 1 << 24], tf.int64), axis=1)
        ok = tf.logical_and(head_ok, tf.reduce_all(tf.equal(sums, stored)))
        return tf.debugging.Assert(ok, [
            f"hvd_gradq: a gathered payload for gradient #{ctx.slot_index} {list(ctx.shape)} has a wrong header or "
            "checksum (corrupted in transit, or ranks disagree on the scheme); checksums computed/stored:",
            sums, stored])

    # -- state and accounting ----------------------------------------------------------------------
    def slots(self) -> list[dict[str, Any]]:
        """One entry per gradient position: shape, dtype, pattern, steps so far, bytes per step."""
        out = []
        for s in self._host.slots:
            out.append({"index": s.index, "shape": list(s.shape), "dtype": s.dtype,
                        "pattern": s.pattern.value if s.pattern else "fp32",
                        "steps": int(s.step.numpy()), "sent": s.sent, "received": s.received, "fp32": s.fp32})
        return out

    def stats(self) -> dict[str, Any]:
        """Bytes this rank sent and received, last step and in total, per pattern, against fp32
        allreduce (the same layout as the PyTorch frontend's). Sizes are static per slot, and
        the step counters say how often each ran, so nothing is counted inside the graph."""
        st = Stats()
        for s in self._host.slots:
            k = int(s.step.numpy())
            if k == 0:
                continue
            p = s.pattern.value if s.pattern else "fp32"
            st.last[str(s.index)] = (p, s.sent, s.received, s.fp32)
            c = st.total[p]
            c.sent += k * s.sent
            c.received += k * s.received
            c.fp32 += k * s.fp32
            c.tensors += k
        return st.summary()


def _is_control_flow_graph(g: Any) -> bool:
    """A ``tf.cond`` branch or ``tf.while_loop`` body/condition graph (TF's ControlFlowFuncGraph)."""
    return any(c.__name__ == "ControlFlowFuncGraph" for c in type(g).__mro__) and hasattr(g, "outer_graph")
