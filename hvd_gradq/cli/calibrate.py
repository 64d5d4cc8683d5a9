"""Time the codec on this CPU: encode and decode nanoseconds an element, per scheme, one thread.

Each spec is timed through the frontends' own host path (:func:`hvd_gradq.reduce.codec.encode`
and :func:`hvd_gradq.dequantize`: kernels, framing, checksum) on standard-normal float32 tensors,
best of a few runs after a warm-up call (a compile is not counted). The cost model that picks
patterns under ``pattern=auto`` reads such a table (``hvd_gradq/plan/cpu_table.py``, written
by ``bench/scale/calibrate_cpu.py`` on the project's machine, through :func:`measure` and
:func:`table_source` here); this command shows how far your CPU is from it, and ``--write FILE``
writes its figures in that module's form. Every rank must read the same table (each rank picks a
tensor's pattern from it, and ranks that pick differently split a collective), so a table of
your own replaces ``hvd_gradq/plan/cpu_table.py`` in the package every host runs. Run it on
a quiet machine: the load average is printed.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import GradqError
from ..frontend import probe
from ..plan.cpu_cost import ns_per_element, table_key
from ..schemes.registry import declarations
from ..spec import parse


def every() -> list[str]:
    """What the project's table holds (``bench/scale/calibrate_cpu.py`` measures these): the specs
    each registered scheme declares for it (``@register(..., calibrate=...)``), in registration
    order. Read when asked, so that a scheme registered after this module loaded is in it."""
    return [spec for d in declarations() for spec in d.calibrate]


#: the command's default: the schemes the README's table and `advise` compare
DEFAULT = ["fp16", "uniform:bits=4", "qsgd:levels=4", "terngrad", "sign", "bingrad", "orq:levels=3",
           "orq:levels=5"]


def measure(spec: str, elements: int = 1 << 20, reps: int = 5) -> tuple[float, float]:
    """(encode, decode) nanoseconds an element of ``spec`` on this CPU: the start-up probe's
    measurement (:func:`hvd_gradq.frontend.probe.measure`) on a larger tensor."""
    ((_, enc, dec),) = probe.measure([parse(spec).scheme], elements=elements, reps=reps).ns
    return enc, dec


def table_source(rows: Mapping[str, tuple[float, float]], load: tuple[float, float]) -> str:
    """The text of a ``cpu_table.py`` module holding ``rows`` (table key -> (encode, decode) ns an
    element), with the load average at the start and end of the measurement."""
    body = "\n".join(f"    {k!r}: ({round(e, 2)}, {round(d, 2)})," for k, (e, d) in rows.items())
    return ('"""Nanoseconds an element that encoding and decoding cost one rank, per scheme: the CPU term\n'
            "of the pattern cost model (:mod:`.cpu_cost`). Measured by ``bench/scale/calibrate_cpu.py`` or\n"
            f"``python -m hvd_gradq calibrate --write`` (one thread, {os.cpu_count()}-core host, load average "
            f"{load[0]:.1f} / {load[1]:.1f}); do not edit by hand."
            '"""\n\n'
            f"NS_PER_ELEMENT: dict[str, tuple[float, float]] = {{\n{body}\n}}\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", help=f"schemes to time (default: {' '.join(DEFAULT)})")
    p.add_argument("--elements", type=int, default=1 << 20, help="tensor size each is timed on (default 1048576)")
    p.add_argument("--reps", type=int, default=3, help="runs of each, the best kept (default 3)")
    p.add_argument("--write", type=Path, metavar="FILE",
                   help="also write the figures as a cpu_table.py module (the cost model's table) to FILE")


def run(args: argparse.Namespace) -> int:
    if args.elements < 1 or args.reps < 1:
        raise GradqError("--elements and --reps must be at least 1")
    specs = args.specs or DEFAULT
    for s in specs:
        parse(s)  # every spec checked before any timing
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} on {os.cpu_count()} CPUs; {args.elements:,} elements, best of {args.reps}")
    print(f"{'scheme':22s} {'encode ns/el':>13s} {'decode ns/el':>13s} {'table encode':>13s} {'table decode':>13s}")
    rows: dict[str, tuple[float, float]] = {}
    for s in specs:
        e, d = measure(s, args.elements, args.reps)
        rows[table_key(parse(s).scheme)] = (e, d)
        te, td = ns_per_element(parse(s).scheme)
        print(f"{s:22s} {e:13.2f} {d:13.2f} {te:13.2f} {td:13.2f}", flush=True)
    print("table: the cost model's figures (hvd_gradq/plan/cpu_table.py, the project's machine; "
          f"keys such as {table_key(parse(specs[0]).scheme)!r})")
    if args.write is not None:
        try:
            args.write.write_text(table_source(rows, (load[0], os.getloadavg()[0])))
        except OSError as e:
            raise GradqError(f"--write {args.write}: cannot be written ({e.strerror})") from None
        print(f"wrote {args.write}")
    return 0
