"""What encoding and decoding cost a rank, per element: the CPU term of the pattern cost model.

The frontends measure the schemes they use at start-up on every rank (:mod:`.probe`) and agree
through their first-step handshake on the maximum over ranks (:class:`Figures`): a per-rank
timing alone would differ between ranks and split a collective, the agreed maximum cannot.
Callers with no job at hand (``advise``, the benchmarks' models, unit tests) read a measured
table (:mod:`.cpu_table`, written by ``bench/scale/calibrate_cpu.py``).

**Your machine's table.** ``python -m hvd_gradq calibrate --out FILE`` times the codec on the
machine it runs on and writes a JSON table (:func:`write_table`); ``advise --cpu-table FILE``
(:func:`use_table`) and the variable ``HVD_GRADQ_CPU_TABLE=FILE`` (:data:`TABLE_ENV`, read at each
decision that needs the table, so a job's compressors price with it: :mod:`hvd_gradq.frontend.probe`)
put its figures in place of the shipped ones, key by key: a scheme the file lacks keeps the
shipped figures. Caches that depend on the table are cleared when it changes
(:func:`on_table_change`). A scheme the table lacks
is interpolated in its level count (ORQ's search grows about linearly in the levels past 5;
QSGD and uniform barely move), and a scheme family it lacks gets :data:`UNKNOWN`, a cost on the
slow side so that such a scheme is not sent down a pattern that multiplies its decoding.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GradqError
from ..schemes.scheme import Scheme
from .cpu_table import NS_PER_ELEMENT

#: A table file (``calibrate --out``) whose figures replace the shipped ones where it has them.
TABLE_ENV = "HVD_GRADQ_CPU_TABLE"
#: The first key of such a file, so that any other JSON is refused rather than half-read.
FORMAT = "hvd_gradq cpu table 1"

UNKNOWN = (10.0, 2.0)
#: Adding one float32 array into another, a rank's share of summing decoded payloads (ns an element).
ADD_NS = 0.6
#: The key of Horovod's fp16 cast (float32 -> float16 before its allreduce, back after) in :class:`Figures`.
CAST = "horovod:fp16-cast"
#: That cast's (there, back) ns an element when nothing was measured: on the slow side of a
#: framework's vectorized cast (about 0.3-1 ns on x86), so that the table alone sends a tensor
#: to fp16 only where its scheme is clearly slower.
CAST_NS = (1.0, 1.0)


@dataclass(frozen=True)
class Figures:
    """(encode, decode) ns an element measured on this job's ranks, by scheme spec (and
    :data:`CAST`), in place of the table's: what :mod:`.probe` measures at start-up and every
    rank agrees on (the maximum over ranks). Hashable, so the cached cost functions key on it;
    a scheme it lacks falls back to the table. ``link_gbps``: the link rate measured beside them
    (:mod:`hvd_gradq.frontend.link`), None where the configured one prices."""

    ns: tuple[tuple[str, float, float], ...] = ()
    link_gbps: float | None = None

    def get(self, key: str) -> tuple[float, float] | None:
        for k, e, d in self.ns:
            if k == key:
                return e, d
        return None


def figures_for(scheme: Scheme, figures: Figures | None) -> tuple[float, float]:
    """(encode, decode) ns an element of ``scheme``: measured where ``figures`` has it, else the table."""
    got = figures.get(scheme.spec) if figures is not None else None
    return got if got is not None else ns_per_element(scheme)


def cast_ns(figures: Figures | None) -> tuple[float, float]:
    """Horovod's fp16 cast there and back (ns an element): measured, else :data:`CAST_NS`."""
    got = figures.get(CAST) if figures is not None else None
    return got if got is not None else CAST_NS


def table_key(scheme: Scheme) -> str:
    """The table's key for a scheme: its name and the one parameter that changes its speed,
    as the scheme declares them (:attr:`~hvd_gradq.schemes.scheme.Scheme.speed_key`: ``orq:5``),
    so that a new scheme needs no line here."""
    return scheme.speed_key


@dataclass(frozen=True)
class Table:
    """(encode, decode) ns an element by table key (:func:`table_key`), and where they came from:
    the shipped module, or it with a file's figures in place (``source`` names the file).
    Hashable, so :func:`ns_per_element`'s cache keys on the table as well as the scheme."""

    source: str
    rows: tuple[tuple[str, float, float], ...]

    @functools.cached_property
    def ns(self) -> dict[str, tuple[float, float]]:
        return {k: (e, d) for k, e, d in self.rows}


SHIPPED = Table("the shipped table (hvd_gradq/plan/cpu_table.py, the project's 2-core machine)",
                tuple((k, e, d) for k, (e, d) in NS_PER_ELEMENT.items()))
_chosen: str | None = None  # use_table()'s file, over the variable's
_loaded: dict[str, Table] = {}
_dependents: list[Callable[[], None]] = []
_last: list[Table] = [SHIPPED]


def on_table_change(clear: Callable[[], None]) -> None:
    """Call ``clear`` (a cache's ``cache_clear``) whenever the table in use changes."""
    _dependents.append(clear)


def write_table(path: Path, rows: Mapping[str, tuple[float, float]], measured: Mapping[str, Any]) -> None:
    """Write ``rows`` (table key -> (encode, decode) ns an element) as a table file, with how they
    were ``measured`` (CPU count, load, sizes), for :func:`read_table`."""
    body = {"format": FORMAT, "ns_per_element": {k: [round(e, 3), round(d, 3)] for k, (e, d) in rows.items()},
            "measured": dict(measured)}
    path.write_text(json.dumps(body, indent=1) + "\n")


def read_table(path: str | Path) -> Table:
    """The shipped table with the figures of the file at ``path`` in place; a GradqError that
    names the file and what is wrong with it (missing, not JSON, not a table, a bad figure)."""
    def bad(why: str) -> GradqError:
        return GradqError(f"{path}: not a CPU table written by `python -m hvd_gradq calibrate --out` ({why})")

    try:
        body = json.loads(Path(path).read_text())
    except OSError as e:
        raise GradqError(f"{path}: cannot read the CPU table ({e.strerror})") from None
    except ValueError as e:
        raise bad(f"not JSON: {e}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("ns_per_element"), dict):
        raise bad(f"its format is not {FORMAT!r} with an ns_per_element object")
    ns = dict(NS_PER_ELEMENT)
    for key, pair in body["ns_per_element"].items():
        ok = isinstance(pair, list) and len(pair) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in pair)
        if not ok:
            raise bad(f"{key}: {pair!r} is not [encode, decode] nanoseconds an element")
        ns[key] = (float(pair[0]), float(pair[1]))
    return Table(str(path), tuple((k, e, d) for k, (e, d) in ns.items()))


def use_table(path: str | Path | None) -> Table:
    """Price with the table file at ``path`` from now on (``advise --cpu-table``), over
    :data:`TABLE_ENV`; None: back to the variable, else the shipped table. Returns it."""
    global _chosen
    if path is not None:
        _loaded[str(path)] = read_table(path)  # read now: a bad file fails here, not at a decision
    _chosen = None if path is None else str(path)
    return table()


def table() -> Table:
    """The table in use: :func:`use_table`'s file, else :data:`TABLE_ENV`'s, else the shipped one."""
    path = _chosen or os.environ.get(TABLE_ENV, "").strip() or None
    if path is None:
        current = SHIPPED
    else:
        if path not in _loaded:
            _loaded[path] = read_table(path)
        current = _loaded[path]
    if current is not _last[0]:
        _last[0] = current
        for clear in _dependents:
            clear()
    return current


def ns_per_element(scheme: Scheme) -> tuple[float, float]:
    """(encode, decode) nanoseconds an element for ``scheme`` on one core, from the table in use
    (:func:`table`)."""
    return _ns(scheme, table())


@functools.lru_cache(maxsize=1024)
def _ns(scheme: Scheme, tab: Table) -> tuple[float, float]:
    key = table_key(scheme)
    if key in tab.ns:
        return tab.ns[key]
    family, _, arg = key.partition(":")
    points = sorted((int(k.partition(":")[2]), v) for k, v in tab.ns.items()
                    if k.partition(":")[0] == family and k.partition(":")[2].isdigit())
    if not arg.isdigit() or len(points) < 2:
        return UNKNOWN
    x = int(arg)
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)  # the segment around x, or the last one
    (x0, (e0, d0)), (x1, (e1, d1)) = points[i - 1], points[i]
    t = (x - x0) / (x1 - x0)
    return max(e0 + t * (e1 - e0), 0.1), max(d0 + t * (d1 - d0), 0.1)


ns_per_element.cache_clear = _ns.cache_clear  # type: ignore[attr-defined]  # as when it was cached itself
