"""The two frontends' names, in one table: what messages call each framework, the top-level
module of its tensor types, and the Horovod module its compressor talks to.

The slips caught first (:mod:`.guards`: the other framework's tensor, the other Horovod
initialized) and the factories' keyword checks (:mod:`.factory`: ``codec= is PyTorch only``)
both name frontends; one table keeps their wording from drifting apart. Keyed by the frontend's
module name, which is what each frontend passes down (its ``__name__``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frontend:
    module: str  # the frontend users import: hvd_gradq.torch
    framework: str  # what messages call the framework: PyTorch
    tensors: str  # the top-level module of its tensor types: torch
    horovod: str  # the Horovod module its compressor talks to: horovod.torch


FRONTENDS: dict[str, Frontend] = {f.module: f for f in (
    Frontend("hvd_gradq.torch", "PyTorch", "torch", "horovod.torch"),
    Frontend("hvd_gradq.tensorflow", "TensorFlow", "tensorflow", "horovod.tensorflow"),
)}


def other(frontend: str) -> Frontend:
    """The frontend that is not ``frontend`` (a module name of :data:`FRONTENDS`)."""
    return next(f for f in FRONTENDS.values() if f.module != frontend)
