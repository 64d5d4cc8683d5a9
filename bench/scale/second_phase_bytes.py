#!/usr/bin/env python3
"""Bytes an element each scheme below 4 bits moves with the pattern ``auto`` chooses, against
Horovod's fp16 ring, at 8, 64 and 1,024 workers and 1 Gbit/s, from the library's cost model
(issue 24's target: at most 1/4 of fp16 ring's bytes).

    .venv/bin/python bench/scale/second_phase_bytes.py [--out results/scale/second_phase_bytes.md]

The model is GPT-2 small's parameter list (``scale_model.gpt2_small``), one rank a host, each
tensor reduced as ``decide`` picks at the rate (fallback off: the scheme's own bytes), its
bytes the busier direction of the host's link. ``--before`` prices the scatter pattern's old
second phase (``scheme.refined(sqrt(N))``) instead of :func:`~hvd_gradq.plan.second_phase.reduced_scheme`,
for the comparison. A second table takes one large tensor alone (GPT-2's 38.6M-element
embedding), where the per-chunk overheads (a payload header, chunks cut on bucket boundaries)
vanish: what the two phases cost an element by themselves.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench.scale.scale_model import BELOW_4_BITS, LABELS, SCHEMES, gpt2_small, host_bytes, numel, ring  # noqa: E402
from hvd_gradq.plan import decide, second_phase  # noqa: E402
from hvd_gradq.plan.pattern import Pattern  # noqa: E402
from hvd_gradq.schemes.scheme import Scheme  # noqa: E402
from hvd_gradq.spec import parse_scheme  # noqa: E402

NS = (8, 64, 1024)
GBPS = 1.0
TARGET = 0.25


def old_reduced(scheme: Scheme, nranks: int) -> Scheme:
    """The second phase before the cheap one: the same scheme, sqrt(N) times finer."""
    return scheme.refined(math.sqrt(nranks))


def use_old_second_phase() -> None:
    second_phase.reduced_scheme = old_reduced  # type: ignore[assignment]
    for f in (decide.cost, decide.choose, decide.hier_cross):
        f.cache_clear()


def table(shapes: list[tuple[int, ...]], title: str) -> list[str]:
    elements = sum(numel(s) for s in shapes)
    out = [f"### {title}", "", "| scheme | second phase (N = 8) | " + " | ".join(
        f"N = {n}: B/el (x fp16), patterns" for n in NS) + " |", "|---|---|" + "---|" * len(NS)]
    fp16 = {n: ring(shapes, n, 2) for n in NS}
    out.insert(2, "fp16 ring: " + ", ".join(f"{fp16[n] / elements:.3f} B/el at N = {n}" for n in NS) + "\n")
    misses = []
    for spec in [s for s in SCHEMES if s in BELOW_4_BITS]:
        scheme = parse_scheme(spec)
        second = second_phase.reduced_scheme(scheme, NS[0])
        name = "its own" if second == scheme else second.spec.split(":")[0] + ":" + ",".join(
            p for p in second.spec.split(":")[1].split(",") if p.startswith(("bits", "levels", "rounding")))
        cells = []
        for n in NS:
            b, _, used = host_bytes(spec, shapes, n, 1, Pattern.AUTO, GBPS)
            ratio = b / fp16[n]
            if ratio > TARGET:
                misses.append(f"{LABELS[spec]} at N = {n} ({ratio:.3f})")
            pats = ", ".join(f"{k} {v}" for k, v in sorted(used.items()))
            cells.append(f"{b / elements:.3f} ({ratio:.3f}{' **over**' if ratio > TARGET else ''}), {pats}")
        out.append(f"| {LABELS[spec]} | {name} | " + " | ".join(cells) + " |")
    out += ["", "Over 1/4 of fp16's bytes: " + ("; ".join(misses) if misses else "none"), ""]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", action="store_true", help="price the old second phase, refined(sqrt(N))")
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args()
    if args.before:
        use_old_second_phase()
    which = "old second phase, refined(sqrt(N))" if args.before else "cheap second phase (reduced_scheme)"
    shapes = gpt2_small()
    lines = [f"## Bytes an element at {GBPS:g} Gbit/s, pattern auto, one rank a host: {which}", ""]
    lines += table(shapes, "GPT-2 small (124M parameters, 148 tensors)")
    lines += table([max(shapes, key=numel)], "one 38.6M-element tensor (GPT-2's embedding)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
