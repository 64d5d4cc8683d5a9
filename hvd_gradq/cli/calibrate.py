"""Time the codec on this CPU: encode and decode nanoseconds an element, per scheme, one thread.

Each spec is timed through the frontends' own host path (:func:`hvd_gradq.reduce.codec.encode`
and :func:`hvd_gradq.dequantize`: kernels, framing, checksum) on standard-normal float32 tensors,
best of a few runs after a warm-up call (a compile is not counted), and printed beside the figures
the cost model prices with now. ``--out FILE`` writes them as a table of this machine
(:func:`hvd_gradq.plan.cpu_cost.write_table`, JSON) for what reads CPU figures: ``advise
--cpu-table FILE`` models your machine instead of the project's, and a job launched with
``HVD_GRADQ_CPU_TABLE=FILE`` prices its ``pattern=auto`` decisions with it instead of timing
at start-up (the ranks still agree on the maximum of their figures, so hosts whose files differ
cannot choose differently). ``--write FILE`` writes the shipped table's module form
(``hvd_gradq/plan/cpu_table.py``, which ``bench/scale/calibrate_cpu.py`` regenerates through
:func:`measure` and :func:`table_source` here). Run it on a quiet machine: the load average is
printed.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import GradqError
from ..frontend import probe
from ..plan.cpu_cost import ns_per_element, table, table_key, write_table
from ..schemes.registry import declarations
from ..spec import parse


def every() -> list[str]:
    """What the project's table holds (``bench/scale/calibrate_cpu.py`` measures these): the specs
    each registered scheme declares for it (``@register(..., calibrate=...)``), in registration
    order. Read when asked, so that a scheme registered after this module loaded is in it."""
    return [spec for d in declarations() for spec in d.calibrate]


#: the command's default: the schemes the README's table and `advise` compare
DEFAULT = ["fp16", "uniform:bits=4", "qsgd:levels=4", "terngrad", "sign", "bingrad", "orq:levels=3",
           "orq:levels=5", "orq:levels=9", "topk"]


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
    p.add_argument("--out", type=Path, metavar="FILE",
                   help="write this machine's table (JSON) to FILE, for `advise --cpu-table FILE` and jobs run with "
                        "HVD_GRADQ_CPU_TABLE=FILE")
    p.add_argument("--write", type=Path, metavar="FILE",
                   help="write the figures in the shipped table's module form (hvd_gradq/plan/cpu_table.py) to FILE")


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
    print(f"table: what the cost model prices with now, {table().source} (keys such as "
          f"{table_key(parse(specs[0]).scheme)!r})")
    measured = {"cpus": os.cpu_count(), "load": [round(load[0], 2), round(os.getloadavg()[0], 2)],
                "elements": args.elements, "reps": args.reps}
    if args.out is not None:
        save(args.out, "--out", lambda path: write_table(path, rows, measured))
        print(f"wrote {args.out}: `python -m hvd_gradq advise --cpu-table {args.out} ...`, or a job with "
              f"HVD_GRADQ_CPU_TABLE={args.out}")
    if args.write is not None:
        save(args.write, "--write", lambda path: path.write_text(table_source(rows, (load[0], os.getloadavg()[0]))))
        print(f"wrote {args.write}")
    return 0


def save(path: Path, flag: str, write: Callable[[Path], object]) -> None:
    """``write(path)``, an OSError turned into a GradqError naming the option and the file."""
    try:
        write(path)
    except OSError as e:
        raise GradqError(f"{flag} {path}: cannot be written ({e.strerror})") from None
