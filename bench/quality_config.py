"""What the parts of the quality study share: the schemes, the targets, file names."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

SCHEMES = [
    "none", "fp16", "orq:levels=3", "orq:levels=5", "orq:levels=9", "bingrad:ef=true",
    "bingrad:variant=pb,ef=true", "qsgd:levels=2", "terngrad", "sign:ef=true", "topk:ratio=0.01,ef=true",
    "uniform:bits=4",
]
TARGETS = [("orq:levels=5", 0.5), ("orq:levels=3", 1.5), ("bingrad:ef=true", 1.5)]
DUMP_NAME = "grads_none_seed0.npz"
ERROR_DRAWS = 8  # quantizations per gradient for the sampled statistics


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def run_name(spec: str, seed: int) -> str:
    safe = spec.replace(":", "_").replace(",", "_").replace("=", "-")
    return f"{safe}__seed{seed}"

