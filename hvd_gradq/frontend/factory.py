"""The public constructors both frontends export: ``ORQ(levels=5, ...)``, ``from_spec``,
``from_env``, one a scheme.

A factory splits its keyword arguments into the scheme's parameters and the compressor's
options (the frontend says which keys are the compressor's), builds the scheme and hands both to
the frontend's compressor class. Positional arguments go to the compressor unchanged (PyTorch's
``named_parameters``). Kept framework-free so that either frontend imports it without the other.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..registry import build

C = TypeVar("C")

#: The environment variable ``from_env`` reads.
ENV = "HVD_GRADQ"

#: (exported name, scheme name, docstring) of every per-scheme factory, in export order.
SCHEME_FACTORIES: tuple[tuple[str, str, str], ...] = (
    ("NoCompression", "none", "fp32 payloads through hvd_gradq's own collectives (a baseline)."),
    ("FP16", "fp16", "Half precision, 2x."),
    ("Uniform", "uniform", "Deterministic uniform quantization: ``Uniform(bits=8, ...)``."),
    ("QSGD", "qsgd", "QSGD: ``QSGD(levels=4, norm='max', ...)``."),
    ("TernGrad", "terngrad", "TernGrad: ``TernGrad(clip=2.5, ...)``."),
    ("Sign", "sign", "Scaled sign (EF-signSGD with ``ef=True``)."),
    ("TopK", "topk", "Top-K: ``TopK(ratio=0.01, values='fp16', ef=True, ...)``."),
    ("BinGrad", "bingrad", "BinGrad (Xu et al. 2020): ``BinGrad(variant='b'|'pb', ef=True, ...)``; error feedback "
     "is on by default (it is biased; ``ef=False`` is the paper's plain form). results/quality.md."),
    ("ORQ", "orq", "ORQ (Xu et al. 2020): ``ORQ(levels=5, ...)``; the default ORQ-5 kept fp32's accuracy in "
     "results/quality.md."),
)


def env_spec(default: str = "none") -> str:
    """The spec in ``HVD_GRADQ``, or ``default`` when it is unset or empty."""
    return os.environ.get(ENV, default) or default


def scheme_factory(
    name: str, doc: str, construct: Callable[..., C], compressor_keys: Sequence[str]
) -> Callable[..., C]:
    """A constructor for scheme ``name``: ``factory(*args, **kwargs)`` builds the scheme from the
    keywords not in ``compressor_keys`` (a bad one raises SpecError listing the valid ones) and
    returns ``construct(scheme, *args, **compressor_options)``."""

    def make(*args: Any, **kwargs: Any) -> C:
        comp = {k: kwargs.pop(k) for k in compressor_keys if k in kwargs}
        return construct(build(name, **kwargs), *args, **comp)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = doc
    return make


def scheme_factories(construct: Callable[..., C], compressor_keys: Sequence[str]) -> dict[str, Callable[..., C]]:
    """Every factory of :data:`SCHEME_FACTORIES`, keyed by its exported name."""
    return {
        export: scheme_factory(name, doc, construct, compressor_keys) for export, name, doc in SCHEME_FACTORIES
    }
