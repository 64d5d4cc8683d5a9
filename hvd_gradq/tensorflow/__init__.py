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

import os
from typing import Any

from ..spec import build, parse
from .compressor import GradqCompressor
from .ops import TF, TFOps

ENV = "HVD_GRADQ"
_COMPRESSOR_KEYS = ("seed", "pattern", "check_ranks", "name", "verify", "process_set", "loss_scale")


def from_spec(spec: str, **kwargs: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``); keyword arguments go to
    :class:`GradqCompressor` (seed, pattern, check_ranks, name, verify, process_set, loss_scale)."""
    return GradqCompressor(parse(spec), **kwargs)


def from_env(default: str = "none", **kwargs: Any) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable (else ``default``)."""
    return from_spec(os.environ.get(ENV, default) or default, **kwargs)


def _factory(name: str, doc: str) -> Any:
    def make(**kwargs: Any) -> GradqCompressor:
        comp = {k: kwargs.pop(k) for k in _COMPRESSOR_KEYS if k in kwargs}
        return GradqCompressor(build(name, **kwargs), **comp)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = doc
    return make


NoCompression = _factory("none", "fp32 payloads through hvd_gradq's own collectives (a baseline).")
FP16 = _factory("fp16", "Half precision, 2x.")
Uniform = _factory("uniform", "Deterministic uniform quantization: ``Uniform(bits=8, ...)``.")
QSGD = _factory("qsgd", "QSGD: ``QSGD(levels=4, norm='max', ...)``.")
TernGrad = _factory("terngrad", "TernGrad: ``TernGrad(clip=2.5, ...)``.")
Sign = _factory("sign", "Scaled sign (EF-signSGD with ``ef=True``).")
TopK = _factory("topk", "Top-K: ``TopK(ratio=0.01, values='fp16', ef=True, ...)``.")
BinGrad = _factory("bingrad", "BinGrad (Xu et al. 2020): ``BinGrad(variant='b'|'pb', ...)``.")
ORQ = _factory("orq", "ORQ (Xu et al. 2020): ``ORQ(levels=5, ...)``.")

__all__ = [
    "ENV", "FP16", "ORQ", "QSGD", "TF", "BinGrad", "GradqCompressor", "NoCompression", "Sign", "TFOps", "TernGrad",
    "TopK", "Uniform", "from_env", "from_spec",
]
