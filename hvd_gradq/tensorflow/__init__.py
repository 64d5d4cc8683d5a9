"""TensorFlow frontend: Horovod compressors for ``horovod.tensorflow`` and ``horovod.tensorflow.keras``.

    import hvd_gradq.tensorflow as gq
    compression = gq.ORQ(levels=5)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=compression)

``gq.from_spec("orq:levels=5,ef=true")`` builds any scheme from a config string;
``gq.from_env()`` reads it from ``HVD_GRADQ``. The factories' and these functions' keywords are
the scheme's parameters and :class:`GradqCompressor`'s options
(:mod:`hvd_gradq.frontend.factory`); ``help(gq.ORQ)`` lists them. The compressor is a
``tf.Module``: pass it to ``tf.train.Checkpoint(compressor=compression, ...)`` to save
error-feedback residuals and the random streams' positions. See
:mod:`hvd_gradq.tensorflow.compressor` for how gradients are identified, where the state lives
and what crosses the wire.

Sparse gradients (``tf.IndexedSlices``, e.g. of an ``Embedding``) never reach a compressor:
Horovod allgathers their values and indices itself, uncompressed. Pass
``sparse_as_dense=True`` to Horovod to have them densified and compressed like the others.
"""
from __future__ import annotations

from typing import Any

from ..frontend.factory import ENV, SchemeFactory, check_options, env_scheme, scheme_factories, with_options
from ..spec import parse
from .compressor import GradqCompressor
from .ops import TF, TFOps


def from_spec(spec: str, **options: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``); ``options`` are
    :class:`GradqCompressor`'s (seed, pattern, link_gbps, name, ...)."""
    check_options(options, GradqCompressor, __name__, "from_spec()")
    return GradqCompressor(parse(spec), **options)


def from_env(default: str | None = None, **options: Any) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable. Unset or empty:
    ``default``, or ``none`` (no compression) with a warning when no default is given. A bad
    spec in the variable raises an error naming it."""
    check_options(options, GradqCompressor, __name__, "from_env()")
    return GradqCompressor(env_scheme(default), **options)


with_options(from_spec, GradqCompressor)
with_options(from_env, GradqCompressor)

_F: dict[str, SchemeFactory[GradqCompressor]] = scheme_factories(GradqCompressor, __name__)
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
