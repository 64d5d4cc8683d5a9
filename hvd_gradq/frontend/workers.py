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

**How many threads.** One setting, ``threads=`` (compressor option) or ``HVD_GRADQ_THREADS``,
resolved by :func:`resolve_threads` to a count R: given, or by default the cores this rank has on
its host (cores // local_size) when that is 2 or more, else 0. A training job already uses its
cores (torch's intra-op threads, one process per core or per GPU), so a rank with a single core
runs everything inline and never competes with training. R sets two things (:func:`start`):

- the codec's threads, max(R, 1): each tensor's encode and decode split over that many threads
  in ranges of whole buckets (:mod:`hvd_gradq.kernels.parallel`, the same bytes for any count);
- this pool, min(R, 1) worker: one worker overlaps encoding with backward and decoding with the
  network; more would only compete with the codec's own threads for the same cores. 0: inline.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from ..kernels import parallel
from ..kernels.parallel import ENV, MAX_THREADS, check_threads, cores

__all__ = ["ENV", "MAX_THREADS", "Workers", "check_threads", "configure_codec", "cores", "resolve_threads", "start",
           "wait"]

T = TypeVar("T")


def resolve_threads(threads: int | None, local_size: int) -> int:
    """The thread setting R: ``threads`` if given, else ``HVD_GRADQ_THREADS``, else this rank's
    cores when it has 2 or more, else 0 (see the module docstring)."""
    if threads is not None:
        return check_threads(threads, "threads=")
    env = os.environ.get(ENV, "").strip()
    if env:
        return check_threads(env, ENV)
    own = cores() // max(local_size, 1)
    return own if own >= 2 else 0


def configure_codec(threads: int | None, local_size: int | None) -> int:
    """Set the process's codec thread count to max(R, 1) and return R (:func:`resolve_threads`;
    ``local_size`` None: the launcher's count, :func:`hvd_gradq.kernels.parallel.local_ranks`).
    The TensorFlow compressor's whole use of ``threads=``: its host functions run on TF's threads."""
    r = resolve_threads(threads, parallel.local_ranks() if local_size is None else local_size)
    parallel.configure(max(r, 1))
    return r


def start(threads: int | None, local_size: int | None) -> Workers:
    """A PyTorch compressor's threads: :func:`configure_codec`, and the pipelining pool of
    min(R, 1) worker."""
    return Workers(min(configure_codec(threads, local_size), 1))


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
