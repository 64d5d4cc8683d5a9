"""The built-in schemes; importing this package registers them (in :mod:`.registry`).

One file a scheme or small family. Where ORQ's levels are chosen: ``orq.py``; BinGrad's:
``bingrad.py``; what every scheme is: ``scheme.py``; the shared bucketed pipeline and rounding:
``level.py``; the summable pattern's shared scale: ``summable.py``; parameter kinds and spellings:
``options.py``; name -> class and each scheme's declaration: ``registry.py``.

Every module of this package is imported here, found on disk rather than listed: a scheme's
``@register(...)`` runs when its module loads, so a file dropped into this folder is a scheme
with no line to add anywhere else. They load in name order (``pkgutil`` lists them sorted),
which fixes the registry's order and so the frontends' and the calibration's.
"""
import importlib
import pkgutil

from .level import LevelScheme
from .scheme import Combine, Scheme

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Combine", "LevelScheme", "Scheme"]
