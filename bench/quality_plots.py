"""The plots of the quality study (matplotlib, Agg): accuracy against bytes, error against bits."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _label(spec: str) -> str:
    return spec.replace(",ef=true", " +EF").replace(":ef=true", " +EF")


def _styles(n: int) -> list[tuple[Any, str]]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    markers = "osD^vP*Xh<>p"
    return [(cmap(i % 20), markers[i % len(markers)]) for i in range(n)]


def plot_training(rows: list[dict[str, Any]], path: Path, np_: int, optimizer: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    done = [r for r in rows if r["n"]]
    for r, (color, marker) in zip(done, _styles(len(done))):
        if r["spec"] == "none":
            color, marker = "black", "o"
            ax.axhline(r["mean"], color="black", lw=0.6, ls=":")
            ax.axvline(r["fp32_per_step"], color="grey", lw=0.8, ls="--", label="fp32 ring allreduce (bytes)")
        ax.errorbar(r["sent_per_step"], r["mean"], yerr=r["std"] if r["n"] > 1 else None, fmt=marker, color=color,
                    capsize=3, ms=7, label=f"{_label(r['spec'])} ({r['n']} run{'s' if r['n'] > 1 else ''})")
    ax.set_xscale("log")
    ax.set_xlabel(f"bytes rank 0 sent a step ({np_} ranks, log scale)")
    ax.set_ylabel("test accuracy % (mean ± sd over seeds)")
    ax.set_title(f"MNIST-1D CNN, {optimizer}: test accuracy against bytes sent")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def plot_error(rows: list[dict[str, Any]], opt_rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    shown = [r for r in rows if r["err"] > 1e-4]
    off = [r for r in rows if 0 < r["err"] <= 1e-4]
    for r, (color, marker) in zip(shown, _styles(len(shown))):
        kind = "unbiased" if r["unbiased"] else "biased"
        ax.scatter(r["body_bits"], r["err"], marker=marker, color=color, s=50, zorder=3,
                   edgecolors="black" if r["unbiased"] else "none", label=f"{r['spec']} ({kind})")
    orq128 = [r["body_bits"] for r in rows if r["spec"].startswith("orq") and "bucket=128" in r["spec"]]
    opt = [o for o in opt_rows if o["what"].startswith("ORQ")]
    if len(orq128) == len(opt):
        ax.plot(orq128, [o["optimum"] for o in opt], "k*--", ms=11, lw=0.8, mfc="none",
                label="exact optimum of the ORQ variance (bucket 128)", zorder=4)
        ax.plot(orq128, [o["even"] for o in opt], "s:", color="grey", ms=5, lw=0.8,
                label="evenly spaced levels, same s (bucket 128)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bits an element (payload body: codes + per-bucket levels/scales)")
    ax.set_ylabel("relative error E‖Q(x)−x‖² / ‖x‖²")
    note = "; ".join(f"{r['spec']}: {r['err']:.1e} at {r['body_bits']:.0f} bits" for r in off)
    ax.set_title("Error against bits on captured MNIST-1D gradients (black edge: unbiased)"
                 + (f"\noff the chart: {note}" if note else ""), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


