"""One tensor's encode and decode split over a rank's cores: ranges of whole buckets, run on a
process-wide thread pool, with bytes identical to one thread's.

**Why whole buckets.** Every statistic a level scheme keeps (min/max, a norm, a sorted bucket's
levels) is a bucket's own, and every random draw is keyed by the element's global index
(``_nb_common._draw(start + i, sa, sb)``), not by a stream position. So a bucket's meta row and
codes do not depend on which thread encodes it, or on what was encoded before it.

**Why aligned.** Codes are packed ``unit`` symbols at a time (:attr:`Kernel.unit`: eight words
of a sub-byte layout, else one word: 8 symbols of 1, 2 or 4 bits; 5 of ORQ-3, 5 to a byte, and
of ORQ-9, 5 to 16 bits; 24 of ORQ-5, 3 to 7 bits). A range whose first element is a multiple of
``unit`` starts on a byte of the packed output that no other range writes
(:meth:`Kernel.byte_at`), and a range that ends on such a multiple leaves no codes pending, so
its last byte is its own too. Every boundary of a :func:`split` is therefore a multiple of
``q = unit / gcd(bucket, unit)`` buckets. With the meta and codes written where one thread would
write them, and the last range padding the codes as one thread does, the payload is the same
bytes for any thread count; decoding (already by bucket ranges) writes disjoint slices of the
output, so the decoded floats are too.
``tests/unit/test_threads.py`` checks both for every level scheme, against ``threads=1``.

**How many threads.** :func:`resolve`: ``threads=`` if given, else what a compressor set for the
process (:func:`configure`), else ``HVD_GRADQ_THREADS``, else the cores this rank has on its host:
its affinity mask's CPU count // the ranks on the host (``HOROVOD_LOCAL_SIZE`` or the MPI
launcher's ``OMPI_COMM_WORLD_LOCAL_SIZE`` / ``MPI_LOCALNRANKS``; 1 without a launcher), at least
1. 0 means inline, as 1 does. A call makes no more ranges than n // :data:`MIN_RANGE_ELEMS`, so a
tensor under 2 x 64K elements stays on the calling thread (handing a range to a pool thread costs
tens of microseconds; 64K elements take 0.07-7 ms to encode at 1-100 ns an element), 2 x 8K for
the encoders that sort and search (:data:`SEARCH_DIVISOR`).

**The pool.** One ``ThreadPoolExecutor`` for the process, made on first use and replaced by a
larger one when a call asks for more threads (the old one finishes its jobs and exits). The
calling thread encodes the first range itself and waits for the others, so ``threads=k`` keeps
k threads busy. The numba kernels release the GIL (``nogil=True``), so the ranges run in
parallel; concurrent callers (a frontend's worker thread, TensorFlow's inter-op threads) share
the pool, and no job waits on another job, so it cannot deadlock. After ``fork()`` the child drops
its copy (its threads did not survive the fork) and makes a new pool when it needs one.
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import GradqError

#: The environment variable that sets the thread count when no ``threads=`` is given.
ENV = "HVD_GRADQ_THREADS"
MAX_THREADS = 64
#: Elements a range holds at the least (to within an aligned step): no split below twice this.
MIN_RANGE_ELEMS = 1 << 16
#: Encoders that sort and search each bucket (bingrad, orq with 4 levels or more: 20-110 ns an
#: element) split from MIN_RANGE_ELEMS / this: 8K elements are still 0.2-0.9 ms of work.
SEARCH_DIVISOR = 8
#: Where launchers say how many ranks share this host (Horovod's own runner, Open MPI, MPICH/Intel MPI).
LOCAL_SIZE_ENVS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")

Range = tuple[int, int]


def check_threads(value: object, where: str) -> int:
    """``value`` as a thread count, or a GradqError that says what is valid."""
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


def local_ranks() -> int:
    """Ranks on this host, as the launcher told the process (1 when none did)."""
    for var in LOCAL_SIZE_ENVS:
        text = os.environ.get(var, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def rank_cores(local_size: int | None = None) -> int:
    """The cores this rank has: its CPUs // the ranks on its host (``local_size``, else
    :func:`local_ranks`), at least 1."""
    return max(1, cores() // max(local_size or local_ranks(), 1))


_configured: int | None = None


def configure(threads: int | None) -> None:
    """Set the process's thread count for calls that give none (a compressor does this with its
    ``threads=``; the last one built wins); None: back to ``HVD_GRADQ_THREADS`` / the cores."""
    global _configured
    _configured = None if threads is None else check_threads(threads, "threads=")


def configured() -> int | None:
    """What :func:`configure` set, or None."""
    return _configured


def resolve(threads: int | None = None) -> int:
    """The thread count of a call (at least 1): see the module docstring."""
    if threads is not None:
        return max(1, check_threads(threads, "threads="))
    if _configured is not None:
        return max(1, _configured)
    env = os.environ.get(ENV, "").strip()
    if env:
        return max(1, check_threads(env, ENV))
    return rank_cores()


def split(n: int, bucket: int, unit: int, threads: int, min_elems: int = MIN_RANGE_ELEMS) -> list[Range]:
    """At most ``threads`` ranges of whole buckets (b0, b1) that cover the ``ceil(n / bucket)``
    buckets of ``n`` elements in order, every boundary a multiple of ``unit`` elements. As even
    as the alignment allows: their bucket counts differ by at most one aligned step (``q``
    buckets). No more ranges than ``n // min_elems``, so one range when ``n < 2 * min_elems``."""
    nb = -(-n // bucket)
    q = unit // math.gcd(bucket, unit)  # buckets an aligned step holds
    steps = -(-nb // q)
    k = max(1, min(threads, steps, n // max(min_elems, 1)))
    bounds = [min(nb, q * (i * steps // k)) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def plan(n: int, bucket: int, unit: int, threads: int | None, least: int | None = None) -> list[Range]:
    """A call's ranges (:func:`split`, ``threads`` resolved; ``least``: :data:`MIN_RANGE_ELEMS`):
    one range, without asking how many threads (a system call; gradients are mostly small), when
    ``n`` is too small to split."""
    least = max(MIN_RANGE_ELEMS if least is None else least, 1)
    if n < 2 * least:
        if threads is not None:
            check_threads(threads, "threads=")
        return [(0, -(-n // bucket))]
    return split(n, bucket, unit, resolve(threads), least)


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _drop_pool() -> None:
    """After fork(): the copied pool has no threads and the lock may be held by a thread that
    does not exist in the child; start afresh."""
    global _lock, _pool, _pool_size
    _lock, _pool, _pool_size = threading.Lock(), None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_pool)


def _grow(workers: int) -> ThreadPoolExecutor:
    """The pool with at least ``workers`` threads (``_lock`` held). A smaller one is shut down
    without waiting: its queued jobs still run, and nothing is submitted to it after this, since
    every submission happens under the lock, to the current pool."""
    global _pool, _pool_size
    if _pool is None or _pool_size < workers:
        old = _pool
        _pool, _pool_size = ThreadPoolExecutor(workers, thread_name_prefix="hvd_gradq-codec"), workers
        if old is not None:
            old.shutdown(wait=False)
    return _pool


def pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool, with at least ``workers`` threads."""
    with _lock:
        return _grow(workers)


def run(job: Callable[[int, int], None], ranges: Sequence[Range]) -> None:
    """``job(b0, b1)`` for every range: the first on this thread, the others on the pool; returns
    once all have finished (they write into the caller's buffers), raising the first error."""
    if len(ranges) == 1:
        job(*ranges[0])
        return
    with _lock:
        ex = _grow(len(ranges) - 1)
        futures: list[Future[None]] = [ex.submit(job, b0, b1) for b0, b1 in ranges[1:]]
    try:
        job(*ranges[0])
    finally:
        errors = [f.exception() for f in futures]  # waits for each
    for e in errors:
        if e is not None:
            raise e
