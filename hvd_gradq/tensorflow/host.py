"""The gather, scatter and hierarchical patterns' payloads, made and read on the host by the code
PyTorch uses.

Every payload of those patterns in the TensorFlow frontend is encoded and decoded by the NumPy
functions here, each phase's in one ``tf.numpy_function`` (:class:`.transport.GraphCodec` makes
the ops; the summable pattern sends no payload: its statistics and int32 code lanes are graph
ops, :mod:`.collectives` and :mod:`.codec`): the bytes come from :func:`hvd_gradq.api.quantize`'s
own pieces (the compiled kernels of every level scheme, or the NumPy reference where the input
holds NaN/Inf, a value beyond ``scheme.limit``, or the scheme has no kernel) and
:class:`hvd_gradq.Payload`'s layout; the gathered payloads are parsed, checked (header, CRC-32, codes) and decoded by
:func:`hvd_gradq.api.split` / :func:`~hvd_gradq.api.decode_flat`. So the frontend lays no bytes
of its own (``hvd_gradq/wire`` owns them), and a TensorFlow step costs what a PyTorch step costs
for the same scheme: as a TF op chain, ORQ-5's level search alone took 94% of a small model's
step (issue 13). The bytes are the NumPy reference's, bit for bit (``tests/unit/test_tf_ops.py``).

Why the graph stays correct:

* *Static shapes.* ``numpy_function`` outputs have unknown shapes; each payload's size is known
  when the graph is built (its header plus ``scheme.nbytes``: :func:`chunk_sizes`), so it is
  set, and Horovod's allgather or alltoall is traced with it.
* *Nothing raises before the collective.* An exception in the encoder would fail this rank
  only and leave the others waiting in the collective. The encoder never raises for values:
  non-finite input and values beyond the limit take the reference path, which marks their
  buckets NaN (under ``nonfinite=raise`` the codec sends the poison payload,
  :mod:`hvd_gradq.wire.poison`, in place of what was encoded: :class:`.transport.GraphCodec`);
  a scheme that refuses a value itself (``fp16:overflow=raise``: RangeError) sends the poison
  saying so instead, each chunk's padded to its size.
  Decoding runs after the collective on the same bytes on every rank, so a poison or corrupted
  payload fails every rank alike, with the same message (PyTorch's: the ranks and why).
* *Draws.* The two seed words come from a step counter in a variable of the graph
  (:func:`.transport.words`), so a retrace or a restored checkpoint continues the same random stream.

Not XLA-compilable (``jit_compile=True``), as Horovod's own collectives are not.

*Time* (``stats()``): while a compressor traces a tensor's reduction it names, with
:func:`recording`, where each host function's wall time goes and the step counter of the
tensor's variable (a tensor of the graph, passed in as one more input), so the seconds land in
their own step even where two steps' host calls interleave. *Waiting* has no host call of its
own (Horovod's collectives are graph ops): a :class:`Handoff` notes when each step's payload left
its encoder, and the decoder that reads the collective's result counts the time since as
``wait``: the collective, the other ranks' lateness, and the executor's scheduling between.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import kernels
from ..api import Payload, decode_flat, payload_of, split
from ..errors import RangeError, RankMismatchError
from ..kernels import feedback as fused
from ..reduce import stop
from ..reduce.codec import decode_sum
from ..reduce.integrity import Phase, verify_payloads
from ..schemes.level import LevelScheme
from ..schemes.scheme import Scheme
from ..wire import poison
from ..wire.payload import header_size
from ..wire.poison import poisons
from ..xp import NUMPY

#: (record(kind, seconds, step), step tensor) of the reduction being traced: :func:`recording`.
_RECORDER: ContextVar[tuple[Callable[[str, float, int], None], Any] | None] = ContextVar(
    "hvd_gradq_host_recorder", default=None)


@contextmanager
def recording(record: Callable[[str, float, int], None], step: Any) -> Iterator[None]:
    """While tracing a tensor's reduction: every host function traced in the block reports its
    wall time as ``record(kind, seconds, step)``, ``kind`` "encode" or "decode", ``step`` the
    value ``step`` (an int64 tensor of the graph, or an int) held when it ran."""
    token = _RECORDER.set((record, step))
    try:
        yield
    finally:
        _RECORDER.reset(token)


class Handoff:
    """When each step's payload of one tensor left its encoder (step -> ``perf_counter``), for the
    decoder of the collective's result to count the time between as ``wait`` (one a tensor's
    codec: its phases run one after another within a step)."""

    def __init__(self) -> None:
        self._left: dict[int, float] = {}
        self._lock = threading.Lock()

    def left(self, step: int) -> None:
        with self._lock:
            self._left[step] = time.perf_counter()

    def arrived(self, step: int, now: float) -> float | None:
        """Seconds since step ``step``'s payload left, once (None: no payload noted)."""
        with self._lock:
            t0 = self._left.pop(step, None)
        return None if t0 is None else max(now - t0, 0.0)


def timed(fn: Callable[..., Any], inputs: list[Any], kind: str,
          handoff: Handoff | None = None) -> tuple[Callable[..., Any], list[Any]]:
    """``fn`` and its inputs for ``tf.numpy_function``, timed into the recorder of the trace, if any
    (the caller makes the op itself: an error it raises names the frames that made it, and a
    graph's error message lists them before the error's own text). With ``handoff``, an encoder
    notes when its payload left and a decoder records the ``wait`` since."""
    rec = _RECORDER.get()
    if rec is None:
        return fn, inputs
    record, step = rec

    def run(at: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        waited = handoff.arrived(int(at), t0) if handoff is not None and kind == "decode" else None
        if waited is not None:
            record("wait", waited, int(at))
        try:
            return fn(*args)
        finally:
            record(kind, time.perf_counter() - t0, int(at))
            if handoff is not None and kind == "encode":
                handoff.left(int(at))

    return run, [step, *inputs]


def _parts(scheme: Scheme, x: NDArray[np.float32], a: int, b: int) -> dict[str, Any]:
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if isinstance(scheme, LevelScheme) and np.isfinite(lo) and np.isfinite(hi) and max(-lo, hi) < scheme.limit:
        fast = kernels.encode(scheme, x, (a, b))
        if fast is not None:
            return fast
    # no kernel (none, fp16, topk), NaN/Inf (level schemes mark those buckets NaN), beyond the
    # limit, or kernels turned off
    words: Any = (np.int64(a), np.int64(b))  # the seed already split (xp.uniforms takes either)
    with np.errstate(all="ignore"):
        return dict(scheme.encode(NUMPY, x, words))


def _payload(scheme: Scheme, shape: tuple[int, ...], dtype: str, x: NDArray[Any], a: int,
             b: int) -> Payload:
    """The payload of flat ``x``."""
    parts = _parts(scheme, np.ascontiguousarray(x, np.float32).reshape(-1), a, b)
    return payload_of(scheme, parts, shape, dtype)


def chunk_sizes(scheme: Scheme, bounds: tuple[tuple[int, int], ...],
                header: tuple[tuple[int, ...], str] | None = None) -> list[int]:
    """Bytes of each chunk's payload (:func:`chunk_encoder`)."""
    ndim = 1 if header is None else len(header[0])
    return [header_size(scheme.spec, ndim) + scheme.nbytes(hi - lo) for lo, hi in bounds]


@cache
def chunk_encoder(scheme: Scheme, bounds: tuple[tuple[int, int], ...], own: bool,
                  header: tuple[tuple[int, ...], str] | None = None) -> Any:
    """(x f32[n], a int64[N], b int64[N]) -> (the payloads of the chunks ``x[lo:hi]`` of
    ``bounds``, chunk j drawn with words (a[j], b[j]), concatenated in chunk order,
    uint8[total]; with ``own`` this rank's decoded chunks concatenated, f32[n], else f32[0]):
    the NumPy function a graph calls (:class:`.transport.GraphCodec`). Each chunk's payload is a
    flat float32 tensor of its own, as PyTorch's, or, for one chunk with ``header`` (shape,
    dtype), the gradient's. A scheme that refuses a value (``fp16:overflow=raise``: RangeError)
    sends the poison saying so in every chunk, padded to its size: raising here would stop this
    rank before its collective."""
    sizes = chunk_sizes(scheme, bounds, header)
    n = bounds[-1][1] if own else 0

    def host(x: NDArray[np.float32], a: NDArray[np.int64],
             b: NDArray[np.int64]) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
        flat = np.ascontiguousarray(x, np.float32).reshape(-1)
        try:
            ps = [_payload(scheme, header[0] if header else (hi - lo,), header[1] if header else "float32",
                           flat[lo:hi], int(a[j]), int(b[j])) for j, (lo, hi) in enumerate(bounds)]
        except RangeError:
            return poisons(sizes, poison.Stop.RANGE), np.zeros(n, np.float32)
        mine = np.concatenate([decode_flat(p) for p in ps]) if own else np.zeros(0, np.float32)
        return np.concatenate([p.to_array() for p in ps]), np.ascontiguousarray(mine, np.float32)

    return host


@cache
def fed_encoder(scheme: Scheme, bounds: tuple[tuple[int, int], ...], header: tuple[tuple[int, ...], str] | None,
                has_e: bool, scaled: bool) -> Any:
    """(x f32[n] (the raw gradient), a int64[N], b int64[N], [e f32[n], mine bool], [scale f32])
    -> (the payloads of :func:`chunk_encoder`, of ``x + e * scale``; the new residual, f32[n]):
    error feedback's rule and the encode in one pass (:func:`hvd_gradq.kernels.encode_fed`, with
    TensorFlow's subnormals as zeros), the NumPy function a graph calls where the rule would be a
    compensate op, the encode with this rank's own decode, and a residual op. ``mine`` False: the
    residual variable holds another rank's (a restored checkpoint): a zero residual, still added.
    The new residual keeps the old one where it is not finite; the step's other masks (a result
    that is not finite, a warm-up) are the compressor's, once the result is known
    (:meth:`hvd_gradq.feedback.Memory.settle`). Where the one pass does not apply (a compensated
    value that is not finite, or beyond the scheme's range) the same rule runs unfused, on the
    same arrays, as :func:`chunk_encoder` encodes."""

    def host(x: NDArray[np.float32], a: NDArray[np.int64], b: NDArray[np.int64],
             *rest: Any) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
        flat = np.ascontiguousarray(x, np.float32).reshape(-1)
        e = None
        if has_e:
            e = np.ascontiguousarray(rest[0], np.float32).reshape(-1)
            if not bool(rest[1]):
                e = np.zeros_like(flat)
        scale = float(rest[-1]) if scaled else None
        new = np.empty_like(flat)
        made = []
        for j, (lo, hi) in enumerate(bounds):
            parts = kernels.encode_fed(scheme, flat[lo:hi], None if e is None else e[lo:hi], scale,
                                       (int(a[j]), int(b[j])), new[lo:hi], flush=True)
            if parts is None:
                return _unfused(flat, e, scale, a, b)
            made.append(payload_of(scheme, parts, header[0] if header else (hi - lo,),
                                   header[1] if header else "float32").to_array())
        return (made[0] if len(made) == 1 else np.concatenate(made)), new

    def _unfused(flat: NDArray[np.float32], e: NDArray[np.float32] | None, scale: float | None,
                 a: NDArray[np.int64], b: NDArray[np.int64]) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
        p = flat if e is None else fused.compensate(flat, e, scale, flush=True)
        buf, own = chunk_encoder(scheme, bounds, True, header)(p, a, b)  # (a poison stops the step)
        return buf, fused.residual(p, own, scale, None, e, flush=True)

    return host


@cache
def verifier(finder: int, phase: int, ranks: tuple[int, ...] | None, count: int) -> Any:
    """buf uint8 -> float64 (1,): this rank's finding on a received buffer of payloads
    (:func:`hvd_gradq.reduce.integrity.verify_payloads`), ``count`` rows of one payload each
    (a poison padded to the row), or the payloads one after the other (``count`` 0): the NumPy
    function a graph calls before the verdict round. It never raises."""

    def host(buf: NDArray[np.uint8]) -> NDArray[np.float64]:
        arr = np.ascontiguousarray(buf)
        if count:
            arr = arr.reshape(count, -1)
        return verify_payloads(arr, finder, Phase(phase), ranks)

    return host


@cache
def rows_decoder(rank: int, what: str = "", ranks: tuple[int, ...] | None = None, guarded: int | None = None) -> Any:
    """rows uint8[size, width] (and, optionally, this rank's decoded payload, used in place of
    decoding row ``rank`` again) -> the sum of every rank's decoded payload in rank order, float32:
    the NumPy function a graph calls. Every payload is parsed and checked (header, CRC-32, codes)
    and decoded straight into the one sum buffer (:func:`hvd_gradq.reduce.codec.decode_sum`, the
    host codec's sum); every rank runs this on the same bytes (decoding is deterministic: the own
    payload given is what its row decodes to).

    A row that holds a poison (:mod:`hvd_gradq.wire.poison`: a rank whose gradient held NaN/Inf
    under ``nonfinite=raise``, or a value its scheme refused) raises the error PyTorch's frontend
    raises, naming ``what``, the ranks (row i is rank ``ranks[i]``, by default i) and why.
    ``guarded`` (the element count): the rows are followed by a finding of :func:`verifier`, and
    where it names a corrupted payload the result is zeros, undecoded (the verdict round names it)."""

    def host(rows: NDArray[np.uint8], *mine: NDArray[np.float32]) -> NDArray[np.float32]:
        if guarded is not None:
            found, mine = mine[0], mine[1:]
            if np.any(found != 0):
                return np.zeros(guarded, np.float32)
        rows = np.ascontiguousarray(rows)
        stops = stop.stops_in(rows, ranks)  # a poison padded to its row: looked for by rows
        if stops:
            raise stop.stopped(f"hvd_gradq: {what}", stops)
        own = np.ascontiguousarray(mine[0], np.float32).reshape(-1) if mine else None
        total, _ = decode_sum(rows.reshape(-1), rank, own, f"hvd_gradq: {what}", ranks)
        return total

    return host


@cache
def chunks_decoder(sizes: tuple[int, ...], rank: int, what: str = "", ranks: tuple[int, ...] | None = None,
                   guarded: bool = False) -> Any:
    """Gathered uint8 (one payload a rank, in rank order, of ``sizes[r]`` elements; optionally
    this rank's decoded payload, used in place of decoding payload ``rank``) -> every payload
    decoded, concatenated in rank order, f32[sum]: the NumPy function a graph calls. Every rank
    runs it on the same bytes; with ``ranks`` (payload i from rank ``ranks[i]``) a poison raises
    first, as in :func:`rows_decoder` (``guarded`` as there)."""

    def host(buf: NDArray[np.uint8], *mine: NDArray[np.float32]) -> NDArray[np.float32]:
        if guarded:
            found, mine = mine[0], mine[1:]
            if np.any(found != 0):
                return np.zeros(sum(sizes), np.float32)
        flat = np.ascontiguousarray(buf).reshape(-1)
        stops = stop.stops_in(flat, ranks) if ranks is not None else None
        if stops:
            raise stop.stopped(f"hvd_gradq: {what}", stops)
        payloads = split(flat)
        got = tuple(p.n for p in payloads)
        if got != sizes:
            raise RankMismatchError(f"reduced chunks of {list(got)} elements; this rank expects {list(sizes)}")
        pieces = [np.asarray(mine[0], np.float32) if r == rank and mine else decode_flat(p)
                  for r, p in enumerate(payloads)]
        return np.concatenate(pieces)

    return host
