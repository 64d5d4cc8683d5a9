"""What Horovod's call of ``compress()`` says: the parameter, the reduction and the process set.

Horovod 0.28.1 hands a compressor nothing but the tensor, yet what the compressor must do
depends on the call: which parameter the gradient belongs to (``sparse_as_dense`` hands over a
fresh dense copy that no hook has seen), the process set whose ranks take part, ``op`` and the
pre/post scale factors. Every place that calls ``compression.compress`` in Horovod 0.28.1's torch
package holds these as locals of the calling frame (read from its source, ``horovod/torch``):

========================================================  =============================================
caller (``co_name`` in ``optimizer.py`` / ``mpi_ops.py``)   locals
========================================================  =============================================
``_DistributedOptimizer._allreduce_grad_async(self, p)``    ``self`` (``op``, ``process_set``), ``p``, ``name``
``_grouped_allreduce_grad_async(self, ps)`` via listcomp    listcomp: ``p``; above: ``self``
``_DistributedAdasumOptimizer._allreduce_grad_async``       ``self`` (an Adasum optimizer), ``p``
``allreduce(tensor, ..., op, ..., process_set)``            ``name``, ``op``, ``average``, ``process_set``
``grouped_allreduce(tensors, ...)`` via listcomp            listcomp: ``t``; above: ``tensors``, ``name``, ...
``reducescatter`` / ``grouped_reducescatter``               (not a reduction a compressor can serve)
========================================================  =============================================

Reading frames is a fact about one Horovod version, so it lives here alone, returns ``None``
for any caller it does not recognise (a user calling ``compress()`` directly), and is checked by
the compatibility suite against Horovod's own tests.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import horovod.torch as hvd
import torch

from ..errors import GradqError


@dataclass(frozen=True)
class CallSite:
    """One ``compress()`` call as Horovod made it."""

    kind: str  # "optimizer", "grouped", "allreduce", "adasum", "reducescatter"
    op: Any  # Horovod's op constant (hvd.Average, hvd.Sum, ...); None where Horovod defaults it
    process_set: Any  # the ProcessSet the reduction runs on
    name: str | None  # Horovod's name for the tensor (the optimizer's parameter name), if any
    param: Any = None  # the parameter whose gradient this is (optimizer calls)
    # Horovod's optimizer: it reduces p.grad in place and sets p.grad to decompress()'s result,
    # so the tensor's storage may hold the result (stock Horovod's own allreduce_async_ writes
    # there); hvd.allreduce and grouped_allreduce return a new tensor and leave theirs alone
    writes_back: bool = False


def _is_horovod(frame: FrameType, module: str) -> bool:
    path = frame.f_code.co_filename.replace("\\", "/")
    return path.endswith(f"horovod/torch/{module}")


def _op_of(local: dict[str, Any]) -> Any:
    op, average = local.get("op"), local.get("average")
    if op is None and average is not None:  # Horovod's backwards-compatible ``average=``
        return hvd.Average if average else hvd.Sum
    return hvd.Average if op is None else op


def inspect_call(depth: int = 2) -> CallSite | None:
    """The call site of the ``compress()`` that called this (``depth`` frames up), or None."""
    try:
        f: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    if f is None:
        return None
    code = f.f_code.co_name
    local = f.f_locals
    if code == "<listcomp>" and f.f_back is not None:
        outer = f.f_back
        up = outer.f_locals
        if _is_horovod(outer, "optimizer.py") and outer.f_code.co_name == "_grouped_allreduce_grad_async":
            opt = up["self"]
            p = local.get("p")
            return CallSite("grouped", opt.op, opt.process_set, opt._parameter_names.get(p), p, True)
        if _is_horovod(outer, "mpi_ops.py") and outer.f_code.co_name in ("grouped_allreduce", "grouped_reducescatter"):
            kind = "grouped" if outer.f_code.co_name == "grouped_allreduce" else "reducescatter"
            t, tensors, base = local.get("t"), up.get("tensors") or (), up.get("name")
            index = next((i for i, x in enumerate(tensors) if x is t), None)
            name = f"{base}.{index}" if base is not None and index is not None else None
            return CallSite(kind, _op_of(up), up.get("process_set"), name)
        return None
    if _is_horovod(f, "optimizer.py") and code == "_allreduce_grad_async":
        opt = local["self"]
        p = local.get("p")
        if not hasattr(opt, "op"):  # _DistributedAdasumOptimizer: compresses parameter deltas
            return CallSite("adasum", hvd.Adasum, None, local.get("name"), p)
        return CallSite("optimizer", opt.op, opt.process_set, local.get("name"), p, True)
    if _is_horovod(f, "mpi_ops.py") and code in ("allreduce", "reducescatter"):
        kind = "allreduce" if code == "allreduce" else "reducescatter"
        return CallSite(kind, _op_of(local), local.get("process_set"), local.get("name"))
    return None


def refuse(site: CallSite | None, tensor: Any) -> None:
    """Raise for a call hvd_gradq cannot serve (an error that says what to use instead): Adasum
    (which reduces parameters, ``tensor`` a ``Parameter``), reducescatter, and ops other than
    Average and Sum."""
    if isinstance(tensor, torch.nn.Parameter) or (site is not None and site.kind == "adasum") or (
        site is not None and site.op == hvd.Adasum
    ):
        raise GradqError(
            "hvd_gradq compressors do not support op=hvd.Adasum (it reduces parameter deltas "
            "pairwise, which quantized payloads cannot be); use op=hvd.Average or hvd.Sum"
        )
    if site is not None and site.kind == "reducescatter":
        raise GradqError(
            "hvd_gradq compressors serve allreduce (DistributedOptimizer, hvd.allreduce); "
            "hvd.reducescatter with compression= is not supported: use Compression.none there"
        )
    if site is not None and site.op not in (hvd.Average, hvd.Sum):
        raise GradqError(
            f"hvd_gradq compressors support op=hvd.Average and hvd.Sum only (got op={site.op}): "
            "quantized payloads are summed, not min/max/product-reduced"
        )
