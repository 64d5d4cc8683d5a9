#!/usr/bin/env python3
"""Measure what encoding and decoding cost a rank, per element, and write the table the
pattern cost model reads (``hvd_gradq/plan/cpu_table.py``).

    .venv/bin/python bench/scale/calibrate_cpu.py            # ~1 min; writes the table and prints it
    .venv/bin/python bench/scale/calibrate_cpu.py --check    # prints, writes nothing

Each spec is timed through the frontends' own host path (``reduce.codec.encode`` and
``api.dequantize``: kernels, framing, checksum) on float32 standard-normal tensors of one
megabyte-sized chunk (256k elements for the slow ORQ level counts), one thread, best of a few
runs, after a warm-up call (numba's compile is not counted). The figures are nanoseconds an
element on the machine that ran this; the cost model compares them with link time, so a
machine much faster or slower than the one that wrote the table shifts where patterns cross
over, not which pattern moves fewer bytes. Rerun this on the training hosts' kind of CPU
for a table of theirs. Run it on a quiet machine (the load average is printed).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hvd_gradq.cli import calibrate  # noqa: E402
from hvd_gradq.plan.cpu_cost import table_key  # noqa: E402
from hvd_gradq.spec import parse_scheme  # noqa: E402

OUT = ROOT / "hvd_gradq" / "plan" / "cpu_table.py"


def measure(spec: str) -> tuple[float, float]:
    """(encode, decode) ns an element: the package's own measurement (``python -m hvd_gradq calibrate``)
    at 1M elements, 256k for the slow ORQ level counts and BinGrad-pb."""
    scheme = parse_scheme(spec)
    slow = (spec.startswith("orq") and scheme.levels > 9) or "pb" in spec  # type: ignore[attr-defined]
    return calibrate.measure(spec, 1 << (18 if slow else 20), 2 if slow else 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print only")
    args = ap.parse_args()
    load = os.getloadavg()
    rows: dict[str, tuple[float, float]] = {}
    specs = calibrate.every()  # what each scheme declares for the table (@register(..., calibrate=...))
    for i, spec in enumerate(specs):
        e, d = measure(spec)
        rows[table_key(parse_scheme(spec))] = (e, d)
        print(f"[{i + 1}/{len(specs)}] {spec:22s} encode {e:8.2f} ns/el  decode {d:6.2f} ns/el", flush=True)
    load2 = os.getloadavg()
    print(f"load average {load[0]:.1f} at start, {load2[0]:.1f} at end")
    if args.check:
        return
    OUT.write_text(calibrate.table_source(rows, (load[0], load2[0])))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
