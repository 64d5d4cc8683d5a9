"""PyTorch frontend: Horovod compressors for ``horovod.torch.DistributedOptimizer``.

    import hvd_gradq.torch as gq
    compression = gq.ORQ(levels=5, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)

``gq.from_spec("orq:levels=5,ef=true", named_parameters=...)`` builds any scheme from a config
string; ``gq.from_env(named_parameters=...)`` reads it from ``HVD_GRADQ``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from ..spec import build, parse
from .compressor import GradqCompressor

ENV = "HVD_GRADQ"
_COMPRESSOR_KEYS = ("seed", "pattern", "check_ranks", "process_set", "loss_scale")


def from_spec(
    spec: str, named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, **kwargs: Any
) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``)."""
    return GradqCompressor(parse(spec), named_parameters, **kwargs)


def from_env(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, default: str = "none", **kwargs: Any
) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable (else ``default``)."""
    return from_spec(os.environ.get(ENV, default) or default, named_parameters, **kwargs)


def _factory(name: str, doc: str) -> Any:
    def make(
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, **kwargs: Any
    ) -> GradqCompressor:
        comp = {k: kwargs.pop(k) for k in _COMPRESSOR_KEYS if k in kwargs}
        return GradqCompressor(build(name, **kwargs), named_parameters, **comp)

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
    "ENV",
    "FP16",
    "ORQ",
    "QSGD",
    "BinGrad",
    "GradqCompressor",
    "NoCompression",
    "Sign",
    "TernGrad",
    "TopK",
    "Uniform",
    "from_env",
    "from_spec",
]
