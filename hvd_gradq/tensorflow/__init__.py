"""TensorFlow frontend: Horovod compressors for ``horovod.tensorflow`` and ``horovod.tensorflow.keras``.

    import hvd_gradq.tensorflow as gq
    compression = gq.ORQ(levels=5)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=compression)

``gq.from_spec("orq:levels=5,ef=true")`` builds any scheme from a config string;
``gq.from_env()`` reads it from ``HVD_GRADQ``. The compressor is a ``tf.Module``: pass it to
``tf.train.Checkpoint(compressor=compression, ...)`` to save error-feedback residuals and the
random streams' positions. See :mod:`hvd_gradq.tensorflow.compressor` for how gradients are
identified, where the state lives and what crosses the wire.

Sparse gradients (``tf.IndexedSlices``, e.g. of an ``Embedding``) never reach a compressor:
Horovod allgathers their values and indices itself, uncompressed. Pass
``sparse_as_dense=True`` to Horovod to have them densified and compressed like the others.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..frontend.factory import ENV, env_spec, scheme_factories
from ..spec import parse
from .compressor import GradqCompressor
from .ops import TF, TFOps

# keywords of a factory that go to the compressor, not to the scheme
_COMPRESSOR_KEYS = ("seed", "pattern", "check_ranks", "name", "process_set", "loss_scale")


def from_spec(spec: str, **kwargs: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``); keyword arguments go to
    :class:`GradqCompressor` (seed, pattern, check_ranks, name, process_set, loss_scale)."""
    return GradqCompressor(parse(spec), **kwargs)


def from_env(default: str = "none", **kwargs: Any) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable (else ``default``)."""
    return from_spec(env_spec(default), **kwargs)


_F: dict[str, Callable[..., GradqCompressor]] = scheme_factories(GradqCompressor, _COMPRESSOR_KEYS)
NoCompression = _F["NoCompression"]
FP16 = _F["FP16"]
Uniform = _F["Uniform"]
QSGD = _F["QSGD"]
TernGrad = _F["TernGrad"]
Sign = _F["Sign"]
TopK = _F["TopK"]
BinGrad = _F["BinGrad"]
ORQ = _F["ORQ"]

__all__ = [
    "ENV", "FP16", "ORQ", "QSGD", "TF", "BinGrad", "GradqCompressor", "NoCompression", "Sign", "TFOps", "TernGrad",
    "TopK", "Uniform", "from_env", "from_spec",
]
