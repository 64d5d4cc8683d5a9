"""Error feedback's classic rule on host arrays, compiled: what :class:`hvd_gradq.feedback.Memory`
runs for CPU float32 tensors instead of the rule's framework operations.

**Why.** Written against a framework's operations the rule is six to eight of them a tensor
(compensate; subtract, divide, isfinite, invert, or, where), each a pass over the tensor and, in
torch, a parallel region of its intra-op pool. Two ranks of two threads each on two cores then
wait for time slices in every region: error feedback cost 1.6-1.9 s a ResNet-18 step that way,
0.2 s with ``OMP_NUM_THREADS=1``. Here it is one pass to compensate and one to keep the residual,
on the threads this rank's codec uses (:mod:`.parallel`: never more than its share of the cores;
a tensor below 2 x 64K elements stays on the calling thread).

**Bits.** The same float32 operations in the same order as :class:`hvd_gradq.feedback.Classic`
and :meth:`~hvd_gradq.feedback.Memory.update` (``x + e * S``; ``(sent - decoded) / S``, the old
residual, or 0 without one, kept where that is not finite or ``keep`` is set), no fused
multiply-add: ``tests/unit/test_feedback.py`` checks them against the framework path bit for bit.
``flush=True`` gives the bits of TensorFlow's CPU kernels instead, which run with flush-to-zero and
denormals-are-zero: every operand and result that is subnormal counts as a zero of its sign
(``tests/unit/test_tf_feedback.py`` checks them against TensorFlow's operations). Without numba
(or with the kernels turned off) the same arithmetic runs as NumPy expressions, which are
single-threaded too.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import parallel
from ._registry import scale_of
from ._switch import available

F32 = NDArray[np.float32]
_NO_KEEP = np.zeros(1, np.bool_)  # what the kernel gets for a mask or result it does not read
_NO_RESULT = np.zeros(1, np.float32)
_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32


def _ranges(n: int) -> list[tuple[int, int]]:
    """Element ranges of ``n`` for this rank's threads (one below 2 x 64K elements)."""
    return [(b0, min(b1, n)) for b0, b1 in parallel.plan(n, 1, 1, None)]


def _flushed(a: Any) -> Any:
    """``a`` with each subnormal a zero of its sign (the NumPy form of ``_nb_feedback._ftz``)."""
    return np.where(np.abs(a) < _TINY, np.copysign(np.float32(0.0), a), a).astype(np.float32)


def compensate(x: F32, e: F32, scale: float | None, out: F32 | None = None, flush: bool = False) -> F32:
    """``x + e * scale`` (``x + e`` where ``scale`` is None) as float32, into ``out`` if given;
    ``flush``: with subnormals as zeros, as TensorFlow computes it."""
    out = np.empty_like(x) if out is None else out
    s, scaled = scale_of(scale, flush)
    if not available():
        f = _flushed if flush else np.asarray
        b = f(e)
        np.copyto(out, f(f(x) + (f(b * s) if scaled else b)))
        return out
    from ._nb_feedback import compensate as kernel  # numba: imported on first use

    parallel.run(lambda e0, e1: kernel(x, e, s, scaled, flush, out, e0, e1), _ranges(x.shape[0]))
    return out


def residual(sent: F32, decoded: F32, scale: float | None, keep: NDArray[np.bool_] | None,
             old: F32 | None, out: F32 | None = None, flush: bool = False, result: F32 | None = None) -> F32:
    """The residual to keep: ``(sent - decoded) / scale`` (no division where ``scale`` is None),
    ``old`` (zeros where None) where that is not finite, ``keep`` is set or ``result`` (the
    step's reduced tensor, or None) is not finite; into ``out`` if given (which may be ``old``).
    ``flush``: with subnormals as zeros, as TensorFlow computes it."""
    out = np.empty_like(sent) if out is None else out
    s, scaled = scale_of(scale, flush)
    if not available():
        f = _flushed if flush else np.asarray
        e: Any = f(f(sent) - f(decoded))
        if scaled:
            e = f(e / s)
        bad = ~np.isfinite(e)
        for also in (keep, None if result is None else ~np.isfinite(result)):
            if also is not None:
                bad = bad | also
        np.copyto(out, np.where(bad, np.float32(0.0) if old is None else old, e))
        return out
    from ._nb_feedback import residual as kernel

    k = _NO_KEEP if keep is None else keep
    r = _NO_RESULT if result is None else result
    o = out if old is None else old
    parallel.run(lambda e0, e1: kernel(sent, decoded, s, scaled, flush, k, keep is not None, r, result is not None, o,
                                       old is not None, out, e0, e1), _ranges(sent.shape[0]))
    return out


def all_finite(x: NDArray[np.float32]) -> bool:
    """Whether every element of flat float32 ``x`` is finite, in one pass on this rank's threads."""
    from . import scan  # the package's input check: the largest magnitude's bits

    found = scan(x, float("inf"))
    return bool(np.isfinite(x).all()) if found is None else found[0]


def warm() -> None:
    """Run both passes once on a few elements: compiles them, or loads them from the kernel cache
    (``python -m hvd_gradq warm`` and the loading ahead of a job's first step call it)."""
    x = np.ones(4, np.float32)
    residual(compensate(x, x, 2.0), x, 2.0, np.zeros(4, np.bool_), x)


# -- the passes a graph runs as host ops (hvd_gradq.feedback.Memory's): the arrays are the inputs' host values --

def _mine(value: Any, mine: Any) -> Any:
    """The stored residual, or None where it is another rank's (``mine`` False): zero."""
    return value if mine is None or bool(mine) else None


def _scalar(scale: Any) -> float | None:
    return None if scale is None else float(scale)


def graph_compensate(flush: bool, x: Any, e: Any, mine: Any = None, scale: Any = None) -> Any:
    """``x + e * S`` (:func:`compensate`), a zero residual where it
    is not this rank's (still added: ``-0.0 + 0.0`` is ``0.0``, as the graph's rule gives)."""
    e = _mine(e, mine)
    return compensate(x, np.zeros_like(x) if e is None else e, _scalar(scale), flush=flush)


def graph_settle(flush: bool, new: Any, old: Any = None, mine: Any = None, result: Any = None,
                 hold: Any = None) -> Any:
    """``new``, the old residual (0 without one, or where another rank's) where ``result`` is not
    finite, all of the old one where ``hold`` is set (:meth:`hvd_gradq.feedback.Memory.settle`). A select: ``flush``
    changes no bits."""
    old = _mine(old, mine)
    keep = old if old is not None else np.zeros_like(new)
    if hold is not None and bool(hold):
        return np.array(keep, np.float32)
    if result is None:
        return new
    return np.where(np.isfinite(result), new, keep).astype(np.float32)


def graph_residual(flush: bool, sent: Any, decoded: Any, old: Any = None, mine: Any = None, scale: Any = None,
                   keep: Any = None, result: Any = None, hold: Any = None) -> Any:
    """The residual to keep (:func:`residual`: ``result``'s NaN/Inf
    looked for in the same pass), all of the old one where ``hold`` is set."""
    if hold is not None and bool(hold):
        keep = np.ones(sent.shape, np.bool_)
    return residual(sent, decoded, _scalar(scale), keep, _mine(old, mine), flush=flush, result=result)
