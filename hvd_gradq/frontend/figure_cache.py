"""This machine's measured CPU figures, kept between jobs beside the kernel cache.

**Why.** The cost model prices with figures measured on the job's own ranks (:mod:`.probe`).
Timing them takes milliseconds, but it needs the kernels of every scheme the model prices
loaded first: the scheme's, and the finer one the scatter pattern re-encodes with, which a job
that gathers never runs otherwise. At a job's first step that loading (importing numba, its CPU
target, each kernel from the cache) was most of the step: 1-5 s on the project's 2-core machine,
against 0.1-0.2 s for Horovod's fp16 (issue 35). The figures change only when the machine or the
kernels do, so each rank measures a scheme once and reads the figure back in later jobs.

**Key.** What the figures depend on: the kernels' sources (:func:`hvd_gradq.kernels._cache.sources_hash`,
for the whole file: figures of other sources are dropped), and within them the CPU model, the
CPUs this process may use, the codec's threads a call (:func:`hvd_gradq.kernels.parallel.resolve`:
the probe's tensor splits over them) and how the probe times (its tensor size and repetitions);
within a key, figures are by scheme spec. Keys of other machines and thread counts stay (a cache
folder shared over a network, jobs of other sizes).

**Where.** ``cpu_figures.json`` in the kernel cache's folder (:func:`hvd_gradq.kernels._cache.cache_dir`:
the package's ``kernels/__pycache__``, ``HVD_GRADQ_CACHE_DIR``...), written whole to a temporary
file then renamed, so that ranks starting together never read half a file (the last writer wins;
what it drops is measured again once). A file that cannot be read or parsed counts as empty, one
that cannot be written keeps nothing: the job then measures at every start, as before.

**Which figure.** Timed when the file lacks it, and kept as the smaller of it and any figure a
racing rank kept first (a busy machine only ever makes a timing longer: the probe keeps the best
of its runs for the same reason). A figure taken while the machine was busy therefore stays
until the kernels change or the file is deleted (``HVD_GRADQ_FIGURES=measure`` times every job
afresh and keeps nothing). The fp16 cast's figure is not kept: it is the frontend's own call
(torch or TF), and timing it costs microseconds.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
from functools import lru_cache
from pathlib import Path

from ..kernels import _cache, parallel

#: The file's name in the kernel cache folder.
FILE = "cpu_figures.json"
#: The first key of the file, so that any other JSON there is ignored rather than half-read.
FORMAT = "hvd_gradq cpu figures 1"


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``; elsewhere what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def _sources() -> str:
    return _cache.sources_hash()[:16]


def key(elements: int, reps: int) -> str:
    """This process's key within the file's kernel sources, for a probe of ``elements`` x ``reps``."""
    return f"{cpu_model()} | cpus {parallel.cores()} | threads {parallel.resolve()} | probe {elements}x{reps}"


def path() -> Path:
    return _cache.cache_dir() / FILE


def _load() -> dict[str, dict[str, list[float]]]:
    """Every key's figures in the file, if they were measured with these kernel sources; else empty."""
    try:
        body = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("kernels") != _sources():
        return {}
    figures = body.get("figures")
    return {k: v for k, v in figures.items() if isinstance(v, dict)} if isinstance(figures, dict) else {}


def _pair(value: object) -> tuple[float, float] | None:
    """[encode, decode] as kept, or None where it is not two finite non-negative numbers."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in value):
        return None
    return float(value[0]), float(value[1])


def read(elements: int, reps: int) -> dict[str, tuple[float, float]]:
    """The kept figures of this key: scheme spec -> (encode, decode) ns an element."""
    kept = _load().get(key(elements, reps), {})
    return {spec: pair for spec, v in kept.items() if (pair := _pair(v)) is not None}


def store(rows: dict[str, tuple[float, float]], elements: int, reps: int) -> None:
    """Keep ``rows`` under this key, each figure the smaller of it and the one kept (a busy
    machine only ever makes a timing longer), beside what the file holds of other keys (those of
    other kernel sources are dropped); silently nothing where the folder cannot be written."""
    figures = _load()
    mine = key(elements, reps)
    kept = figures.get(mine, {})
    for spec, (e, d) in rows.items():
        old = _pair(kept.get(spec))
        kept[spec] = [e, d] if old is None else [min(e, old[0]), min(d, old[1])]
    figures[mine] = kept
    target = path()
    tmp = target.with_name(f"{FILE}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": FORMAT, "kernels": _sources(), "figures": figures}, indent=1) + "\n")
        tmp.replace(target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
