"""numba's side of the kernel cache: the directory :func:`._cache.cache_dir` chose, and one log
line for each kernel that is compiled rather than loaded.

:func:`install` runs once, from :mod:`._nb_common` (every kernel module imports it before
decorating anything), so it comes before numba picks a cache location for any kernel:

- a cache locator, put first in numba's list, that answers only for source files of this folder
  and returns :func:`._cache.cache_dir`; every other function numba caches (another library's,
  the user's) keeps numba's own choice. numba picks a function's locator when the function is
  decorated with ``cache=True`` (``numba.core.caching.CacheImpl``), tries each class in
  ``CacheImpl._locator_classes`` in turn and takes the first that returns one whose directory
  it can write to;
- :func:`._cache.refresh`, which drops cached kernels compiled from other sources;
- a listener on numba's documented ``"numba:compile"`` event (``numba.core.event``), which numba
  broadcasts around an actual compile and not for a load from the cache. Compiling one kernel
  compiles the kernels it calls inside the outer event, so the line is logged when the
  outermost one ends: the kernel, its seconds (callees included) and where it was cached, on
  the logger ``hvd_gradq.kernels`` at INFO (shown where the application or
  :func:`hvd_gradq.log.configure` set up logging).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from numba import __version__ as numba_version
from numba.core import caching, event

from . import _cache

log = logging.getLogger("hvd_gradq.kernels")


def _ours(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().parent == _cache._HERE
    except OSError:
        return False


def locator_class() -> type | None:
    """numba's cache locator for this package's kernel files (:func:`._cache.cache_dir`), or None
    where numba's caching internals are not the ones this was written against (numba 0.58-0.61):
    the kernels then cache where numba decides."""
    try:
        bases = (caching._SourceFileBackedLocatorMixin, caching._CacheLocator)
    except AttributeError:
        return None

    class KernelCacheLocator(*bases):  # type: ignore[misc]
        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(_cache.cache_dir())

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            # None lets numba try its own locators (another package's function, or ours when the
            # directory cannot be written: numba then caches where it can, or compiles every time)
            return super().from_function(py_func, py_file) if _ours(py_file) else None

    return KernelCacheLocator


class CompileLog(event.Listener):  # type: ignore[misc]
    """Logs one line when an outermost compile of one of this package's kernels ends."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = 0.0
        self.compiled = 0  # kernels compiled in this process (outermost compiles: one a log line)

    def on_start(self, ev: Any) -> None:
        if self.depth == 0:
            self.started = time.perf_counter()
        self.depth += 1

    def on_end(self, ev: Any) -> None:
        self.depth -= 1
        if self.depth:
            return
        func = getattr(ev.data.get("dispatcher"), "py_func", None)
        if func is None or not _ours(getattr(func.__code__, "co_filename", "")):
            return
        self.compiled += 1
        log.info("compiled kernel %s.%s in %.1f s (cached in %s; `python -m hvd_gradq warm` compiles every "
                 "kernel ahead of training)", func.__module__.rpartition(".")[2], func.__qualname__,
                 time.perf_counter() - self.started, _cache.cache_dir())


#: the process's one compile log (:func:`install` registers it with numba)
COMPILES = CompileLog()
#: the locator :func:`install` put first in numba's list (None where it could not)
LOCATOR = locator_class()
_installed = False


def install() -> None:
    """Put the locator first in numba's list, drop stale kernels and start the compile log
    (once a process; the compiled modules' imports are serialized by Python's import lock)."""
    global _installed
    if _installed:
        return
    _installed = True
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    locator = LOCATOR
    if impl is None or locator is None or not isinstance(getattr(impl, "_locator_classes", None), list):
        log.warning("numba %s caches hvd_gradq's kernels where it decides, not in %s (its cache internals "
                    "changed); pin numba<0.62 for the documented place", numba_version, _cache.cache_dir())
    else:
        impl._locator_classes.insert(0, locator)
    _cache.refresh()
    event.register("numba:compile", COMPILES)
