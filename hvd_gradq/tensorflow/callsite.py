"""What Horovod's call of ``compress()`` says: the reduction, its scale factors, the process set
and the variable the gradient belongs to (a fact about Horovod 0.28.1's TensorFlow source).

Horovod hands a compressor nothing but the tensor, yet what it must do depends on the call. In
``horovod/tensorflow/__init__.py`` (0.28.1) every ``compression.compress(tensor)`` is made by

======================================================  ==========================================
caller (``co_name``)                                      locals read here
======================================================  ==========================================
``allreduce(tensor, ..., op, prescale_factor,             ``op`` (already resolved from ``average``),
postscale_factor, name, process_set, ...)``               ``prescale_factor``, ``postscale_factor``,
                                                          ``process_set``
``grouped_allreduce(tensors, ...)`` via ``<listcomp>``    the same, one frame further up
``reducescatter`` / ``grouped_reducescatter``             (not a reduction hvd_gradq serves: refused)
======================================================  ==========================================

and, for gradients, further up the same stack (through ``_allreduce_cond`` /
``_grouped_allreduce_cond`` and ``tf.cond``'s tracing), ``allreduce_grads(grads, vars, ...)``
of ``_make_cached_allreduce_grads_fn``: ``vars[i]`` is the variable of ``grads[i]``, found by
identity (``sparse_as_dense`` rebinds ``grads`` to the densified list, which is what reaches
``compress``). Every optimizer and tape of Horovod 0.28.1 (``DistributedGradientTape``, the
Keras and legacy ``DistributedOptimizer``, the local gradient aggregation helpers) reduces
through that function with aligned ``grads`` and ``vars``.

A caller that is not Horovod's (``compress()`` called directly) gives ``CallSite`` with
``known=False``: the compressor then uses its constructor's ``process_set=`` and reads the
reduction from the value Horovod's allreduce hands back.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..errors import GradqError

_HVD_TF = "horovod.tensorflow"  # the module whose functions call compress()
_REDUCTIONS = ("allreduce", "grouped_allreduce")
_SCATTERS = ("reducescatter", "grouped_reducescatter")
_MAX_DEPTH = 80  # frames up to allreduce_grads: tf.cond's tracing and AutoGraph add ~25


@dataclass(frozen=True)
class CallSite:
    """One ``compress()`` call as Horovod made it."""

    known: bool  # the caller is Horovod's allreduce / grouped_allreduce
    kind: str = "direct"  # "allreduce", "grouped_allreduce", "reducescatter", "direct"
    op: Any = None  # Horovod's op constant (hvd.Average, hvd.Sum, hvd.Adasum...)
    prescale: float = 1.0
    postscale: float = 1.0
    process_set: Any = None  # the ProcessSet of the reduction (None: not known)
    variable: Any = None  # the tf.Variable whose gradient this is (None: not known)


def _horovod_function(frame: FrameType) -> str | None:
    """The name of the ``horovod.tensorflow`` function running in ``frame``, else None.

    Inside a ``tf.function`` AutoGraph runs converted copies of Horovod's functions
    (``tf__allreduce`` in a generated file), whose globals are still Horovod's module and
    whose locals keep their names."""
    if frame.f_globals.get("__name__") != _HVD_TF:
        return None
    name = frame.f_code.co_name
    return name[4:] if name.startswith("tf__") else name


def _find_variable(frame: FrameType | None, tensor: Any) -> Any:
    """``vars[i]`` for the ``grads[i]`` that is ``tensor``, from Horovod's ``allreduce_grads``."""
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        if _horovod_function(frame) == "allreduce_grads":
            local = frame.f_locals
            grads, variables = local.get("grads"), local.get("vars")
            if grads is None or variables is None:
                return None
            for i, g in enumerate(grads):
                if g is tensor:
                    return variables[i] if i < len(variables) else None
            return None
        frame, depth = frame.f_back, depth + 1
    return None


def horovod_call_site(tensor: Any, depth: int = 2) -> CallSite:
    """Read the call of ``compress(tensor)`` that is ``depth`` frames above this function.

    Returns ``CallSite(known=False)`` when no Horovod reduction made the call.
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return CallSite(False)
    steps = 0
    while frame is not None and steps < 16:  # compress's own wrappers, a listcomp, AutoGraph's calls
        name = _horovod_function(frame)
        if name in _REDUCTIONS + _SCATTERS:
            local = frame.f_locals
            kind = "reducescatter" if name in _SCATTERS else name
            return CallSite(
                True, kind, local.get("op"), float(local.get("prescale_factor", 1.0)),
                float(local.get("postscale_factor", 1.0)), local.get("process_set"),
                _find_variable(frame.f_back, tensor) if kind != "reducescatter" else None,
            )
        frame, steps = frame.f_back, steps + 1
    return CallSite(False)


def check_op(site: CallSite) -> None:
    """Refuse reductions other than a sum or an average of decoded payloads (Adasum above all:
    Horovod would otherwise average what the compressor hands back, silently)."""
    if site.kind == "reducescatter":
        raise GradqError("hvd_gradq compresses allreduce only; use hvd.Compression.none with reducescatter")
    if site.op is None or site.op in (hvd.Average, hvd.Sum):
        return
    if site.op == hvd.Adasum:
        raise GradqError(
            "op=hvd.Adasum cannot be combined with a hvd_gradq compressor: Adasum combines the gradients "
            "themselves, while hvd_gradq sends quantized payloads and sums their decoded values. Use "
            "op=hvd.Average (or hvd.Sum) with compression, or Adasum with hvd.Compression.none")
    raise GradqError(f"hvd_gradq serves op=Average or op=Sum, not op={site.op!r}; use hvd.Compression.none")


def set_suffix(ps: Any) -> str:
    """Collective-name suffix of a process set (none for the global one)."""
    return "" if ps.process_set_id == 0 else f".p{ps.process_set_id}"


def function_graph() -> Any:
    """The graph of the function being traced: the default graph, or, inside ``tf.cond`` /
    ``tf.while_loop`` branches, the function graph they belong to."""
    g = tf.compat.v1.get_default_graph()
    while _is_control_flow_graph(g):
        g = g.outer_graph
    return g


def _is_control_flow_graph(g: Any) -> bool:
    """A ``tf.cond`` branch or ``tf.while_loop`` body/condition graph (TF's ControlFlowFuncGraph)."""
    return any(c.__name__ == "ControlFlowFuncGraph" for c in type(g).__mro__) and hasattr(g, "outer_graph")
