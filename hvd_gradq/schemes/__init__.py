"""The built-in schemes; importing this package registers them (in :mod:`.registry`).

One file a scheme or small family. Where ORQ's levels are chosen: ``orq.py``; BinGrad's:
``bingrad.py``; what every scheme is: ``scheme.py``; the shared bucketed pipeline and rounding:
``level.py``; the summable pattern's shared scale: ``summable.py``; parameter kinds and spellings:
``options.py``; name -> class: ``registry.py``.
"""
from . import bingrad, orq, plain, qsgd, sign, terngrad, topk, uniform  # noqa: F401
from .level import LevelScheme
from .scheme import Combine, Scheme

__all__ = ["Combine", "LevelScheme", "Scheme"]
