"""What the three MNIST-1D examples share: their few arguments, the data, a learning-rate schedule,
a progress bar and the summary. Copy it along with the example you start from.

MNIST-1D (Greydanus 2020) is generated locally by the ``mnist1d`` package (4000 train / 1000 test
signals of 40 samples, 10 classes; never downloaded) and cached in ``~/.cache/hvd_gradq/``
(``HVD_GRADQ_CACHE`` moves it): generating takes a few seconds, reading it back none.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--compression", default=os.environ.get("HVD_GRADQ") or "orq:levels=5",
                    help="hvd_gradq spec, e.g. 'orq:levels=5,ef=true' (default: $HVD_GRADQ, else orq:levels=5)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05, help="peak Adam learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", metavar="PATH", help="rank 0 writes the summary there")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap.parse_args()


def load_mnist1d(rank: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """This rank's shard (``[rank::size]``, the same length on every rank) of x, y, x_test, y_test."""
    path = Path(os.environ.get("HVD_GRADQ_CACHE") or Path.home() / ".cache" / "hvd_gradq") / "mnist1d-example.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the ranks of one machine: only the first one generates
        if not path.exists():
            from mnist1d.data import get_dataset_args, make_dataset  # never get_dataset: it downloads

            d = make_dataset(get_dataset_args())
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, x=np.float32(d["x"]), y=np.int64(d["y"]),
                     x_test=np.float32(d["x_test"]), y_test=np.int64(d["y_test"]))
            os.replace(tmp, path)
        with np.load(path) as z:
            arrays = [z[k] for k in ("x", "y", "x_test", "y_test")]
    out = []
    for a in arrays:
        n = len(a) // size
        out.append(a[rank::size][:n])
    return out[0], out[1], out[2], out[3]


def lr_at(step: int, total: int, peak: float) -> float:
    """A tenth of the run of linear warm-up, then cosine decay to 0."""
    warmup = max(1, total // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def progress(rank: int, total: int, desc: str, quiet: bool) -> Any:
    """A tqdm bar on rank 0; a silent one elsewhere."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=rank != 0 or quiet, mininterval=1.0)


def report(summary: dict[str, Any], stats: dict[str, Any], path: str) -> None:
    """Print the summary with the compressor's byte counts (this rank's) and write it as JSON."""
    total = stats["total"]["all"]
    summary.update(bytes_sent=int(total["sent"]), bytes_fp32=int(total["fp32"]),
                   ratio_vs_fp32=float(total["ratio_vs_fp32"]))
    print(f"{summary['example']} | {summary['compression']} | {summary['ranks']} ranks, {summary['steps']} steps: "
          f"test accuracy {100 * summary['test_accuracy']:.2f}%, sent {summary['bytes_sent'] / 2**20:.2f} MiB, "
          f"x{summary['ratio_vs_fp32']:.2f} less than fp32", flush=True)
    if path:
        Path(path).write_text(json.dumps(summary, indent=2) + "\n")
