"""Slips a compressor catches before anything else runs, with a message that says what to do.

Horovod duck-types its compressors (``compress``/``decompress``), so a slip in what is passed as
``compression=`` surfaces deep inside Horovod (or inside a ``tf.function`` trace) with an error
about something else. Two are caught here, for both frontends:

* **the class instead of a compressor** (``compression=gq.GradqCompressor``): Horovod calls
  ``GradqCompressor.compress(grad)`` on the class, which Python answers with a ``TypeError``
  about a missing ``tensor``. :class:`instance_only` makes that access return a function that
  raises :class:`~hvd_gradq.errors.GradqError` naming the fix; through an instance it is the
  method as before. (The uncalled factory, ``compression=gq.ORQ``, is caught by the factory
  itself: :mod:`.factory`.)
* **the other framework's tensor** (``hvd_gradq.tensorflow``'s compressor in a PyTorch script, or
  the reverse): each framework has its own Horovod library, so the compressor's first Horovod
  call says "Horovod has not been initialized" although ``hvd.init()`` ran. :func:`check_tensor`
  reads only the module of the tensor's type, so neither frontend imports the other framework.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import GradqError
from .frameworks import FRONTENDS, other

R = TypeVar("R")


def mixed_frontends(frontend: str, why: str) -> GradqError:
    """The error for a compressor of ``frontend`` used with the other framework (``why``: what
    showed it)."""
    them = other(frontend)
    return GradqError(
        f"this is {frontend}'s compressor, and {why}: build the compressor with {them.module} "
        f"(import {them.module} as gq) in a {them.framework} script; each framework has its own Horovod "
        f"({them.horovod}), which {frontend}'s compressor cannot use")


def check_tensor(tensor: Any, frontend: str) -> None:
    """Raise if ``tensor`` belongs to the other framework than ``frontend`` (``hvd_gradq.torch``
    or ``hvd_gradq.tensorflow``). Cheap: the module name of the tensor's type, nothing imported."""
    root = type(tensor).__module__.partition(".")[0]
    them = other(frontend)
    if root == them.tensors:
        raise mixed_frontends(frontend, f"Horovod handed it a {them.framework} tensor ({type(tensor).__name__})")


def check_initialized(frontend: str, initialized: bool) -> None:
    """Before a compressor's first Horovod call: if this frontend's Horovod is not initialized
    (``initialized``) but the other framework's is, the script uses the wrong frontend. Reads
    only modules already imported."""
    if initialized:
        return
    them = other(frontend)
    probe = getattr(sys.modules.get(them.horovod), "is_initialized", None)
    try:
        other_up = bool(probe()) if callable(probe) else False
    except Exception:  # a half-loaded Horovod says nothing either way
        other_up = False
    if other_up:
        raise mixed_frontends(frontend, f"this process initialized {them.horovod}, not "
                                        f"{FRONTENDS[frontend].horovod}")


class instance_only(Generic[R]):  # lower case: a decorator, like ``property``
    """A method that exists on instances only: through the class (``compression=GradqCompressor``
    passed uncalled, then ``GradqCompressor.compress(grad)``) it raises GradqError saying to build
    a compressor first, instead of Python's ``TypeError`` about a missing argument."""

    def __init__(self, method: Callable[..., R]) -> None:
        self.method = method
        self.__doc__ = method.__doc__
        self.__name__ = method.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Callable[..., R]:
        if obj is not None:
            return self.method.__get__(obj, owner)  # type: ignore[no-any-return]
        cls = owner.__name__ if owner is not None else "the compressor class"
        module = getattr(owner, "__module__", "").rpartition(".")[0] or "hvd_gradq"

        def refused(*args: Any, **kwargs: Any) -> R:
            raise GradqError(
                f"{module}.{cls} is the compressor class, not a compressor: pass an instance, built by a "
                f"factory, e.g. compression=gq.ORQ(levels=5) or gq.from_spec('orq:levels=5')")

        return refused
