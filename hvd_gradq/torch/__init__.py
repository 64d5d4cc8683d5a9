"""PyTorch frontend: Horovod compressors for ``horovod.torch.DistributedOptimizer``.

    import hvd_gradq.torch as gq
    compression = gq.ORQ(levels=5, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)

``gq.from_spec("orq:levels=5,ef=true", named_parameters=...)`` builds any scheme from a config
string; ``gq.from_env(named_parameters=...)`` reads it from ``HVD_GRADQ``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..frontend.factory import ENV, env_spec, scheme_factories
from ..spec import parse
from .compressor import GradqCompressor

# keywords of a factory that go to the compressor, not to the scheme
_COMPRESSOR_KEYS = ("named_parameters", "seed", "pattern", "check_ranks", "process_set", "loss_scale", "threads",
                    "codec")


def from_spec(
    spec: str, named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, **kwargs: Any
) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``)."""
    return GradqCompressor(parse(spec), named_parameters, **kwargs)


def from_env(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None, default: str = "none", **kwargs: Any
) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable (else ``default``)."""
    return from_spec(env_spec(default), named_parameters, **kwargs)


# ``ORQ(named_parameters, levels=5, ef=True, seed=1)``: named_parameters positional or keyword
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
