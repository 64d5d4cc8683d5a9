"""The built-in schemes; importing this package registers them (in :mod:`hvd_gradq.registry`).

One file a scheme or small family. Where ORQ's levels are chosen: ``orq.py``; BinGrad's:
``bingrad.py``; the shared bucketed pipeline and rounding: ``base.py``.
"""
from . import bingrad, orq, plain, qsgd, sign, terngrad, topk, uniform  # noqa: F401
from .base import Combine, LevelScheme, Scheme

__all__ = ["Combine", "LevelScheme", "Scheme"]
