"""``python -m hvd_gradq``: what a spec means, which scheme to use, warm the kernels, time the codec.

    python -m hvd_gradq check "orq:levels=3"            # canonical spec, bits an element, what it refuses
    python -m hvd_gradq advise --params 25e6 --ranks 8 --link-gbps 1 10
    python -m hvd_gradq warm                            # compile every kernel once (set-up does this)
    python -m hvd_gradq calibrate --out cpu.json        # the codec's speed on this CPU, as a table
    python -m hvd_gradq check ORQ-5                     # a label as the README and advise print it

Each command is one module of this package; this one only parses the command line. Bad input
exits with status 2 and a message saying what was wrong (argparse's convention); a command that
ran exits 0.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import GradqError
from . import advise, calibrate, check, warm

COMMANDS = {"check": check, "advise": advise, "warm": warm, "calibrate": calibrate}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hvd_gradq", description=(__doc__ or "").split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, mod in COMMANDS.items():
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.split("\n")[0], description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        return int(COMMANDS[args.command].run(args))
    except GradqError as e:
        print(f"{ap.prog} {args.command}: error: {e}", file=sys.stderr)
        return 2
