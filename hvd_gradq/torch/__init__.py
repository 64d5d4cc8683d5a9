"""PyTorch frontend: Horovod compressors for ``horovod.torch.DistributedOptimizer``.

    import hvd_gradq.torch as gq
    compression = gq.ORQ(levels=5, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)

``gq.from_spec("orq:levels=5,ef=true", named_parameters=...)`` builds any scheme from a config
string; ``gq.from_env(named_parameters=...)`` reads it from ``HVD_GRADQ``. The factories' and
these functions' keywords are the scheme's parameters and :class:`GradqCompressor`'s options
(:mod:`hvd_gradq.frontend.factory`); ``help(gq.ORQ)`` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..frontend.factory import ENV, SchemeFactory, check_options, env_scheme, scheme_factories, with_options
from ..spec import parse
from .compressor import GradqCompressor

NamedParameters = Iterable[tuple[str, torch.nn.Parameter]]


def from_spec(spec: str, named_parameters: NamedParameters | None = None, **options: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``); ``options`` are
    :class:`GradqCompressor`'s (seed, pattern, link_gbps, threads, ...)."""
    check_options(options, GradqCompressor, __name__, "from_spec()")
    return GradqCompressor(parse(spec), named_parameters, **options)


def from_env(
    named_parameters: NamedParameters | None = None, default: str | None = None, **options: Any
) -> GradqCompressor:
    """A compressor for the spec in the ``HVD_GRADQ`` environment variable. Unset or empty:
    ``default``, or ``none`` (no compression) with a warning when no default is given. A bad
    spec in the variable raises an error naming it."""
    check_options(options, GradqCompressor, __name__, "from_env()")
    return GradqCompressor(env_scheme(default), named_parameters, **options)


with_options(from_spec, GradqCompressor)
with_options(from_env, GradqCompressor)

# ``ORQ(named_parameters, levels=5, ef=True, seed=1)``: named_parameters positional or keyword
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
