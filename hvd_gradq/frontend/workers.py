"""Encoding and decoding off the training thread: a small thread pool, or inline.

Inside ``DistributedOptimizer`` the training thread calls ``compress()`` from backward hooks,
so encoding a gradient there delays the rest of backward by the encoder's time. The numba
kernels run without the GIL (``nogil``), so a worker thread can encode one gradient (and start
its collective) while the training thread goes on with backward, and decode a gathered gradient
while the next one is still on the wire. :class:`Workers` is that pool; with ``threads=0``
every job runs inline, at the same point, in the same order, so both settings share one code path
and give the same bits (each job's result depends on its inputs only: seeds are per rank, step
and tensor, and sums run in rank order).

**Waiting without the GIL.** Horovod 0.28.1's ``synchronize`` holds the GIL while it waits (its
``WaitAndClear`` spins in C++ with the GIL held), which would stop the workers' Python between
kernels for as long as the training thread waits on the network. :func:`wait` polls instead
and sleeps between polls, releasing the GIL.

**How many threads.** A training job already uses its cores (torch's intra-op threads, one
process per core or per GPU). The default is one worker when the rank has a core of its own to
spare (``cores // local_size >= 2``) and none (inline) otherwise, so the pool never competes
with training on a busy host. ``threads=`` (compressor option) or ``HVD_GRADQ_THREADS`` set it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import GradqError

T = TypeVar("T")

#: The environment variable that sets the worker count when the compressor gets no ``threads=``.
ENV = "HVD_GRADQ_THREADS"
MAX_THREADS = 64


def check_threads(value: Any, where: str) -> int:
    """``value`` as a worker count, or a GradqError that says what is valid."""
    bad = GradqError(f"{where}: {value!r} is not a number of threads; use 0 (inline) .. {MAX_THREADS}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THREADS:
        raise bad
    return value


def cores() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under ``taskset``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_threads(threads: int | None, local_size: int) -> int:
    """The worker count: ``threads`` if given, else ``HVD_GRADQ_THREADS``, else the default
    (one when this rank has a spare core, see the module docstring)."""
    if threads is not None:
        return check_threads(threads, "threads=")
    env = os.environ.get(ENV, "").strip()
    if env:
        return check_threads(env, ENV)
    return 1 if cores() // max(local_size, 1) >= 2 else 0


class Workers:
    """Run jobs on ``threads`` worker threads (0: inline). Jobs of one pool start in submission
    order; with one thread they also finish in it."""

    def __init__(self, threads: int) -> None:
        self.threads = check_threads(threads, "threads=")
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """``fn()`` on a worker, or now (threads=0); its exception is raised by ``result()``."""
        if self.threads == 0:
            done: Future[T] = Future()
            try:
                done.set_result(fn())
            except BaseException as e:  # re-raised by result(), as a pool's job would be
                done.set_exception(e)
            return done
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="hvd_gradq")
            return self._pool.submit(fn)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def wait(poll: Callable[[], bool], *, spin: int = 20, nap: float = 1e-4) -> None:
    """Return once ``poll()`` is true: a few quick polls, then polls ``nap`` seconds apart
    (sleeping releases the GIL; see the module docstring)."""
    for _ in range(spin):
        if poll():
            return
    while not poll():
        time.sleep(nap)
