#!/usr/bin/env python3
"""BinGrad-b against BinGrad-pb (and ORQ-2 for reference) on synthetic buckets, and optionally
on real gradients: error, bias and range, all computed analytically from each bucket's levels.

    .venv/bin/python bench/quality/bingrad_study.py [--buckets 400] [--grads grads.npz] \\
        [--out results/quality/bingrad.md]

For a bucket x of d elements and a scheme's two levels l1 <= l2:
  * -b rounds to the nearer level: Q(x) is deterministic, E[Q(x)] - x = Q(x) - x.
  * -pb rounds stochastically inside [l1, l2] (unbiased there) and clamps outside:
    E[(Q(x)-x)^2] = (l2-c)(c-l1) + (c-x)^2 and E[Q(x)] - x = c - x, with c = clip(x, l1, l2).
  * ORQ-2 is -pb's rule with l1 = min, l2 = max: unbiased, all variance.
Reported per bucket, then averaged over buckets:
  err      = sum E[(Q(x)-x)^2] / ||x||^2                        (mean squared error, relative)
  |bias|   = mean_i |E[Q(x_i)] - x_i| / rms(x)                    (elementwise bias, relative)
  ||bias|| = ||E[Q(x)] - x||_2 / ||x||_2
  sum bias = |sum_i (E[Q(x_i)] - x_i)| / sum_i |x_i|               (bias of the bucket's sum)
  range    = (l2 - l1) / (l2 - l1 of -b)
Levels come from the schemes themselves (``scheme.choose`` on the NumPy reference), float32 as
sent. Real gradients: a .npy (one array) or .npz (several) file; every array is flattened and cut
into buckets of 512 (a short tail bucket is dropped).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hvd_gradq.spec import parse_scheme  # noqa: E402
from hvd_gradq.xp import NUMPY  # noqa: E402

D = 512
SCHEMES = {
    "BinGrad-b": parse_scheme(f"bingrad:variant=b,bucket={D}"),
    "BinGrad-pb": parse_scheme(f"bingrad:variant=pb,bucket={D}"),
}


def synthetic(name: str, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if name == "Gaussian":
        x = rng.standard_normal((rows, D))
    elif name == "Laplace":
        x = rng.laplace(size=(rows, D))
    elif name == "Student-t(2)":
        x = rng.standard_t(2, size=(rows, D))
    else:
        raise ValueError(name)
    return x.astype(np.float32)


def levels(scheme, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for r0 in range(0, x.shape[0], 256):
        out.append(np.asarray(scheme.choose(NUMPY, x[r0 : r0 + 256]), np.float64))
    lv = np.concatenate(out, 0)
    return lv[:, 0:1], lv[:, 1:2]


def metrics(x: np.ndarray, rule: str, l1: np.ndarray, l2: np.ndarray) -> dict[str, np.ndarray]:
    x = x.astype(np.float64)
    if rule == "nearest":
        q = np.where(np.abs(x - l1) <= np.abs(x - l2), l1, l2)
        sq = (q - x) ** 2
        bias = q - x
    else:  # stochastic inside [l1, l2], clamp outside
        c = np.clip(x, l1, l2)
        sq = (l2 - c) * (c - l1) + (c - x) ** 2
        bias = c - x
    n2 = np.sum(x * x, axis=1)
    rms = np.sqrt(n2 / x.shape[1])
    return {
        "err": np.sum(sq, axis=1) / n2,
        "abs_bias": np.mean(np.abs(bias), axis=1) / rms,
        "bias_norm": np.sqrt(np.sum(bias * bias, axis=1) / n2),
        "sum_bias": np.abs(np.sum(bias, axis=1)) / np.sum(np.abs(x), axis=1),
        "range": (l2 - l1)[:, 0],
    }


def study(x: np.ndarray) -> dict[str, dict[str, float]]:
    x = x[np.sum(x.astype(np.float64) ** 2, axis=1) > 0]  # all-zero buckets have no relative error
    b1, b2 = levels(SCHEMES["BinGrad-b"], x)
    p1, p2 = levels(SCHEMES["BinGrad-pb"], x)
    lo = x.min(axis=1, keepdims=True).astype(np.float64)
    hi = x.max(axis=1, keepdims=True).astype(np.float64)
    rows = {
        "BinGrad-b": metrics(x, "nearest", b1, b2),
        "BinGrad-pb": metrics(x, "stochastic", p1, p2),
        "BinGrad-pb rule, -b levels": metrics(x, "stochastic", b1, b2),
        "ORQ-2 (min/max)": metrics(x, "stochastic", lo, hi),
    }
    base = rows["BinGrad-b"]["range"]
    ok = base > 0
    out: dict[str, dict[str, float]] = {}
    for name, m in rows.items():
        out[name] = {k: float(np.mean(v)) for k, v in m.items() if k != "range"}
        out[name]["range"] = float(np.mean(m["range"][ok] / base[ok]))
        out[name]["wider"] = float(np.mean(m["range"][ok] > base[ok]))
    out["_n"] = {"buckets": float(x.shape[0])}
    return out


def table(title: str, res: dict[str, dict[str, float]]) -> str:
    n = int(res["_n"]["buckets"])
    lines = [
        f"### {title} ({n} buckets of {D})",
        "",
        "| scheme | err = E‖Q−x‖²/‖x‖² | mean \\|bias\\| / rms(x) | ‖bias‖/‖x‖ | sum bias "
        "| range / -b's | wider than -b |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in res.items():
        if name.startswith("_"):
            continue
        lines.append(
            f"| {name} | {m['err']:.4f} | {m['abs_bias']:.4f} | {m['bias_norm']:.4f} | {m['sum_bias']:.4f} "
            f"| {m['range']:.3f} | {100 * m['wider']:.0f}% |"
        )
    b, pb = res["BinGrad-b"], res["BinGrad-pb"]
    lines += [
        "",
        f"-pb against -b: error x{pb['err'] / b['err']:.2f}, mean |bias| x{pb['abs_bias'] / b['abs_bias']:.2f}, "
        f"‖bias‖ x{pb['bias_norm'] / b['bias_norm']:.2f}, range x{pb['range']:.2f} "
        f"(wider than -b's in {100 * pb['wider']:.0f}% of buckets).",
    ]
    return "\n".join(lines) + "\n"


def load_grads(path: Path) -> np.ndarray:
    data = np.load(path, allow_pickle=False)
    arrays = [data[k] for k in data.files] if hasattr(data, "files") else [data]
    rows = []
    for a in arrays:
        flat = np.asarray(a, np.float32).reshape(-1)
        full = flat.size // D
        if full:
            rows.append(flat[: full * D].reshape(full, D))
    if not rows:
        raise SystemExit(f"{path}: no array holds a full bucket of {D} elements")
    return np.concatenate(rows, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--buckets", type=int, default=400, help="synthetic buckets per distribution")
    ap.add_argument("--grads", type=Path, help="real gradients: .npy or .npz")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "quality" / "bingrad.md")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.time()
    parts = [
        "# BinGrad-b vs BinGrad-pb",
        "",
        "Generated by `bench/quality/bingrad_study.py` (NumPy reference; levels from `scheme.choose`, float32 as "
        "sent). "
        "All quantities are expectations over the rounding, computed from each bucket's levels, then averaged "
        "over buckets: err = Σ E(Q(x)−x)² / ‖x‖²; mean |bias| = mean_i |E[Q(x_i)]−x_i| / rms(x); "
        "‖bias‖ = ‖E[Q(x)]−x‖ / ‖x‖; sum bias = |Σ_i (E[Q(x_i)]−x_i)| / Σ_i |x_i|; range = (l2−l1) / (l2−l1 of -b). "
        "-b rounds to the nearer level; -pb and ORQ-2 round stochastically inside [l1, l2] and clamp outside. "
        "The row *-pb rule, -b levels* is -pb's rounding rule with -b's levels, the start of -pb's optimiser.",
        "",
    ]
    for i, name in enumerate(("Gaussian", "Laplace", "Student-t(2)")):
        res = study(synthetic(name, args.buckets, args.seed + i))
        parts.append(table(name, res))
        print(parts[-1])
    if args.grads:
        res = study(load_grads(args.grads))
        parts.append(table(f"real gradients: {args.grads.name}", res))
        print(parts[-1])
    parts.append(f"Seed {args.seed}; {time.time() - t0:.1f} s.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
