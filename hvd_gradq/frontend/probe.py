"""The cost model's CPU figures from the machine the job runs on, agreed by every rank.

At its first step over a process set, each frontend times the schemes it may use (the scheme,
the finer one the scatter pattern re-encodes a reduced chunk with, and Horovod's fp16 cast) on
a fixed synthetic tensor, through the same host codec it runs: :func:`measure`, a few
milliseconds a scheme once the kernels are compiled (the warm-up call compiles or loads them).
Loading them was most of a first step (issue 35: numba, its CPU target and every kernel of both
schemes, seconds on a busy machine), so each scheme's figure is timed once a machine and kept
beside the kernel cache (:func:`kept`, :mod:`.figure_cache`); a later job reads it, and loads
only the kernels it runs. The ranks then allgather their figures (:func:`to_row`, one
small float64 collective beside the configuration check) and every rank takes the elementwise
maximum (:func:`agree`): a decision (:func:`hvd_gradq.plan.decide.decide`) reads only agreed values, so
no two ranks can choose differently, and the slowest rank, which the others wait for in every
collective, is the one the model prices. The result is :class:`~.cpu_cost.Figures`; callers
without a job (``advise``, the benchmarks' models) keep the shipped table.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..api import dequantize, split
from ..errors import GradqError, RankMismatchError
from ..plan.cpu_cost import CAST, CAST_NS, TABLE_ENV, Figures, ns_per_element
from ..plan.pattern import Pattern
from ..plan.second_phase import reduced_scheme
from ..reduce import codec
from ..schemes.scheme import Scheme
from . import figure_cache, prefetch

#: Elements of the synthetic tensor: large enough that per-call overhead (framing, checksum,
#: dispatch) is a small share, small enough that the slowest scheme costs milliseconds.
ELEMENTS = 1 << 16
#: Timed runs of each, the best kept (a preempted run only ever makes a figure larger).
REPS = 3
#: The compressors' ``fallback=`` where none is given (1/true/yes/on or 0/false/no/off). Unset:
#: on where ``auto`` measures its plans in the job (PyTorch: :mod:`hvd_gradq.plan.trial`), off
#: where it could only follow the cost model (TensorFlow's traced graphs): the model prices
#: Horovod's fp16 ring at the link rate, and on the emulated 1 Gbit/s link that ring ran 4.6x
#: slower than that (results/e2e/e2e_fallback_on.md), so a modelled default sent ORQ-5 as fp16
#: and made its step slower.
FALLBACK_ENV = "HVD_GRADQ_FALLBACK"
#: ``kept`` (the default), ``measure`` or ``table``. ``kept``: this machine's figures, each
#: scheme's timed once and kept beside the kernel cache for later jobs (:mod:`.figure_cache`: a
#: first step then loads no kernel it does not run); ``measure``: timed at every job's start, as
#: before the cache (a machine whose load has changed for good); ``table``: the table's figures
#: instead of timing this machine, for decisions that are the same from run to run (a
#: reproducible job, a test suite that asserts a pattern choice). The table is the shipped one,
#: or this machine's where ``HVD_GRADQ_CPU_TABLE`` names one (``calibrate --out``:
#: :mod:`hvd_gradq.plan.cpu_cost`), and then ``table`` is the default: the user measured the
#: figures to have them used. Every rank should be set alike; if not, the maximum still makes
#: them agree. Whatever the source, the fp16 cast is timed in the job (microseconds).
FIGURES_ENV = "HVD_GRADQ_FIGURES"
SOURCES = ("kept", "measure", "table")
_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def resolve_fallback(value: bool | None = None, default: bool = False) -> bool:
    """The compressors' ``fallback``: ``value``, else ``HVD_GRADQ_FALLBACK``, else ``default``."""
    if value is None:
        raw = os.environ.get(FALLBACK_ENV)
        if raw is None:
            return default
        if raw.strip().lower() not in _WORDS:
            raise GradqError(f"{FALLBACK_ENV}={raw!r} is not valid: write 1 or 0 (true/false, yes/no, on/off)")
        return _WORDS[raw.strip().lower()]
    if not isinstance(value, bool):
        raise GradqError(f"fallback must be True or False, not {value!r}")
    return value


def schemes_for(scheme: Scheme, nranks: int, local: int = 1) -> list[Scheme]:
    """What the model prices for ``scheme`` over ``nranks`` ranks, ``local`` a host: the scheme and
    the reduced chunk's scheme over the ranks and over the hosts, each once, in a fixed order
    (every rank derives the same list from the configuration the ranks compared)."""
    out: dict[str, Scheme] = {scheme.spec: scheme}
    for k in (nranks, nranks // max(local, 1)):
        if k > 1:
            fine = reduced_scheme(scheme, k)
            out.setdefault(fine.spec, fine)
    return list(out.values())


def priced(pattern: Pattern) -> bool:
    """Whether the cost model chooses for a compressor asked for ``pattern`` (``auto``, and
    ``hierarchical``'s cross-host part), so that its ranks need agreed CPU figures."""
    return pattern in (Pattern.AUTO, Pattern.HIERARCHICAL)


def best_of(f: Callable[[], object], reps: int) -> float:
    """The fastest of ``reps`` runs of ``f``, in seconds (a preempted run only ever makes one longer)."""
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def measure(schemes: list[Scheme], cast: Callable[[NDArray[np.float32]], Any] | None = None,
            elements: int = ELEMENTS, reps: int = REPS) -> Figures:
    """(encode, decode) ns an element of each scheme on this rank, best of ``reps`` after a
    warm-up call; with ``cast`` (the frontend's float32 -> float16 -> float32 round trip) also
    :data:`~.cpu_cost.CAST`, half the round trip each way."""
    if schemes:
        prefetch.settle()  # a kernel compiling beside the timing would slow it
    x = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    rows: list[tuple[str, float, float]] = []
    for s in schemes:
        buf, _ = codec.encode(s, x, 1, "probe")  # compiles or loads the kernels: not counted
        (p,) = split(buf)
        enc = best_of(lambda: codec.encode(s, x, 1, "probe"), reps)  # noqa: B023 (used inside the loop)
        dec = best_of(lambda: dequantize(p), reps)  # noqa: B023
        rows.append((s.spec, enc / elements * 1e9, dec / elements * 1e9))
    if cast is not None:
        cast(x)
        half = best_of(lambda: cast(x), reps) / elements * 1e9 / 2
        rows.append((CAST, half, half))
    return Figures(tuple(rows))


def to_row(figures: Figures) -> NDArray[np.float64]:
    """The figures as one float64 row (encode, decode for each entry, in order) for an allgather."""
    return np.array([v for _, e, d in figures.ns for v in (e, d)], np.float64)


def agree(figures: Figures, gathered: NDArray[Any]) -> Figures:
    """Every rank's :func:`to_row` (``gathered``, rank after rank) to the elementwise maximum,
    under this rank's keys (the same on every rank: they come from the compared configuration).
    Exact float64 arithmetic on the same rows: the same bits on every rank."""
    width = 2 * len(figures.ns)
    flat = np.asarray(gathered, np.float64).reshape(-1)
    if width == 0 or flat.size % width:
        raise RankMismatchError(
            f"ranks measured different sets of schemes ({flat.size} figures for rows of {width}): "
            "build the same compressor on every rank (check_ranks=True names the difference)")
    top = flat.reshape(-1, width).max(axis=0)
    return Figures(tuple((k, float(top[2 * i]), float(top[2 * i + 1])) for i, (k, _, _) in enumerate(figures.ns)))


def agreed(scheme: Scheme, nranks: int, local: int, cast: Callable[[NDArray[np.float32]], Any],
           allgather: Callable[[NDArray[np.float64]], NDArray[Any]]) -> Figures:
    """Measure on this rank (:func:`measure`, through this module's attribute so that a test can
    hand each rank other figures), allgather, and return what every rank agrees on."""
    schemes = schemes_for(scheme, nranks, local)
    source = figures_source()
    if source == "table":
        mine = table(schemes)
    else:
        mine = measure(schemes, cast) if source == "measure" else kept(schemes, cast)
    return agree(mine, allgather(to_row(mine)))


def kept(schemes: list[Scheme], cast: Callable[[NDArray[np.float32]], Any] | None = None) -> Figures:
    """The rows :func:`measure` would return, each scheme's from this machine's kept figures
    (:mod:`.figure_cache`) where they hold it, else timed now (:func:`measure`, through this
    module's attribute) and kept; the cast timed now."""
    have = figure_cache.read(ELEMENTS, REPS)
    missing = [s for s in schemes if s.spec not in have]
    if missing:
        fresh = {k: (e, d) for k, e, d in measure(missing).ns if k != CAST}
        figure_cache.store(fresh, ELEMENTS, REPS)
        have.update(fresh)
    rows = tuple((s.spec, *have[s.spec]) for s in schemes)
    return Figures(rows + (measure([], cast).ns if cast is not None else ()))


def figures_source() -> str:
    """``kept``, ``measure`` or ``table``, from :data:`FIGURES_ENV` (unset: ``table`` where
    :data:`~hvd_gradq.plan.cpu_cost.TABLE_ENV` names a table of this machine, else ``kept``)."""
    default = "table" if os.environ.get(TABLE_ENV, "").strip() else "kept"
    raw = os.environ.get(FIGURES_ENV, default).strip().lower() or default
    if raw not in SOURCES:
        raise GradqError(f"{FIGURES_ENV}={raw!r} is not valid: write kept (this machine's figures, timed once and "
                         "kept beside the kernel cache: the default), measure (timed at every start-up) or table "
                         "(the shipped figures: the same decisions in every run)")
    return raw


def table(schemes: list[Scheme]) -> Figures:
    """The rows :func:`measure` would return, from the shipped table (and the default cast cost)."""
    rows = [(s.spec, *ns_per_element(s)) for s in schemes]
    return Figures(tuple(rows) + ((CAST, *CAST_NS),))
