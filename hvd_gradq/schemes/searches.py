"""The host level searches the sorted schemes call through ``Ops.host``: a slot the schemes own.

ORQ from 4 levels (its exact dynamic program) and BinGrad-pb (its exact two levels) choose their
levels on the host, by a search that :mod:`hvd_gradq.kernels` holds once, as Python that numba
compiles. The kernels package sits above the schemes (its kernels register per scheme class),
so a scheme must not import it, not even inside a function: instead it asks this slot by name,
and :mod:`hvd_gradq.kernels.search` fills the slot when it loads. It always has by the time a
scheme encodes: importing any ``hvd_gradq`` module runs the package's ``__init__``, which loads
the kernels (``hvd_gradq.api``). ``tests/unit/test_structure.py`` keeps the schemes free of
imports from the layers above them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numpy.typing import NDArray

from ..errors import GradqError

#: ORQ's levels: (buckets float32 (rows, w), s) -> levels float32 (rows, s)
ORQ = "orq"
#: BinGrad-pb's levels: buckets float32 (rows, w) -> levels float32 (rows, 2)
BINGRAD_PB = "bingrad_pb"

Search = Callable[..., NDArray[Any]]
_SLOT: dict[str, Search] = {}


def provide(name: str, fn: Search) -> None:
    """Install the search ``name`` (:data:`ORQ`, :data:`BINGRAD_PB`); the last one wins, so a
    reloaded kernels module replaces its own."""
    _SLOT[name] = fn


def search(name: str) -> Search:
    """The installed search ``name``, or a GradqError saying what provides it."""
    try:
        return _SLOT[name]
    except KeyError:
        raise GradqError(f"the {name} level search is not installed: import hvd_gradq (its kernels package "
                         "provides it, hvd_gradq.kernels.search)") from None
