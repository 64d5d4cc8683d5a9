#!/usr/bin/env python3
"""Bytes a host's link carries per step at 2 ... 1,024 workers, and the modelled step time, from
the library's own cost model.

    .venv/bin/python bench/scale/scale_model.py            # writes results/scale/scale.md and results/scale/scale.png

For every scheme, worker count N and topology (one rank a host, or 8 ranks a host as on GPU
servers), each tensor of a model is reduced with the pattern ``hvd_gradq.plan.decide.decide``
picks (what a run with ``pattern=auto`` does at that link rate: bytes at the rate plus the
measured encode/decode CPU, ``plan/cpu_table.py``), and with each pattern forced. A host's
bytes are the larger of what its link sends and receives, summed over the tensors. Baselines:
Horovod's fp32 and fp16 ring allreduce (2(N-1)/N times the tensor over each host's link,
whatever the ranks a host). Step time = link time + encode/decode CPU, no overlap with compute
and no latency term: a model for ranking, not a forecast.

The model is GPT-2 small's parameter list (124M, 148 tensors), the size where compression is
asked for; the per-tensor policy matters because its biases and LayerNorm weights (768 floats)
go fp32. Where the numbers come from: ``cost`` is checked against the bytes that crossed each
emulated link at 2, 4 and 8 hosts and 2 hosts x 2 ranks (``results/scale/scale_emulated.md``); larger
N are modelled, not measured.

Target (issue 16): for every N, every scheme below 4 bits moves at most 1/4 of fp16 ring
allreduce with the chosen pattern. The report says where it does not.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hvd_gradq.plan.decide import cost, decide, fp32_cost, seconds
from hvd_gradq.plan.pattern import EVERY, Pattern
from hvd_gradq.spec import parse_scheme

ROOT = Path(__file__).resolve().parents[2]
NS = [2 ** k for k in range(1, 11)]
RATES = {"1 Gbit/s": 1.0, "10 Gbit/s": 10.0, "25 Gbit/s": 25.0, "100 Gbit/s": 100.0}
MAIN_RATE = 10.0
TOPOLOGIES = {1: "1 rank a host", 8: "8 ranks a host"}
SCHEMES = ["orq:levels=3", "orq:levels=5", "orq:levels=9", "bingrad", "sign", "qsgd:levels=4", "terngrad",
           "uniform:bits=4"]
LABELS = {"orq:levels=3": "ORQ-3", "orq:levels=5": "ORQ-5", "orq:levels=9": "ORQ-9", "bingrad": "BinGrad+EF",
          "sign": "sign", "qsgd:levels=4": "QSGD-4", "terngrad": "TernGrad", "uniform:bits=4": "uniform-4"}
BELOW_4_BITS = {"orq:levels=3", "orq:levels=5", "orq:levels=9", "bingrad", "sign", "qsgd:levels=4", "terngrad"}
FORCED = (Pattern.GATHER, Pattern.SCATTER, Pattern.SUMMABLE, Pattern.HIERARCHICAL)


def gpt2_small() -> list[tuple[int, ...]]:
    """GPT-2 small's parameter shapes (Radford et al. 2019; 124,439,808 parameters)."""
    d, ff, vocab, ctx, layers = 768, 3072, 50257, 1024, 12
    shapes: list[tuple[int, ...]] = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, ff), (ff,), (ff, d), (d,)]
    return shapes + [(d,), (d,)]


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def local_of(nranks: int, per_host: int) -> int:
    """Ranks a host as the frontends see it: one host (N <= per_host) counts as one a host."""
    return per_host if nranks > per_host else 1


def host_bytes(spec: str, shapes: list[tuple[int, ...]], nranks: int, per_host: int, pattern: Pattern,
               gbps: float) -> tuple[int, float, dict[str, int]]:
    """(bytes a host's link moves: max of sent and received, summed over tensors; modelled
    seconds; tensors per pattern)."""
    scheme = parse_scheme(spec)
    local = local_of(nranks, per_host)
    total, secs, used = 0, 0.0, {}
    for shape in shapes:
        n, nd = numel(shape), len(shape)
        p = decide(scheme, n, nd, nranks, pattern, EVERY, local, gbps, fallback=False).pattern  # the scheme's own bytes
        c = fp32_cost(n, nranks) if p is Pattern.FP32 else cost(scheme, n, nd, nranks, p, local, gbps)
        total += max(c.sent, c.received)
        secs += seconds(scheme, n, nd, nranks, p, local, gbps)
        used[p.value] = used.get(p.value, 0) + 1
    return total, secs, used


def ring(shapes: list[tuple[int, ...]], nranks: int, bytes_per: int) -> int:
    return sum(round(2 * (nranks - 1) / nranks * bytes_per * numel(s)) for s in shapes)


def model(shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    rows: dict[str, Any] = {"fp32": {}, "fp16": {}}
    for n in NS:
        rows["fp32"][n] = {"bytes": ring(shapes, n, 4)}
        rows["fp16"][n] = {"bytes": ring(shapes, n, 2)}
    for spec in SCHEMES:
        rows[spec] = {}
        for per_host in TOPOLOGIES:
            for n in NS:
                row: dict[str, Any] = {"rates": {}}
                for gbps in RATES.values():
                    b, t, used = host_bytes(spec, shapes, n, per_host, Pattern.AUTO, gbps)
                    row["rates"][gbps] = {"bytes": b, "seconds": t, "patterns": used}
                row["forced"] = {}
                for p in FORCED:
                    if p is Pattern.HIERARCHICAL and local_of(n, per_host) == 1:
                        continue
                    try:
                        row["forced"][p.value] = host_bytes(spec, shapes, n, per_host, p, MAIN_RATE)[0]
                    except Exception:  # summable: not for this scheme, or lanes that do not fit
                        continue
                rows[spec][(per_host, n)] = row
    return rows


def report(rows: dict[str, Any], shapes: list[tuple[int, ...]]) -> str:
    params = sum(numel(s) for s in shapes)
    head = " | ".join(f"N={n}" for n in NS)
    out = ["# Scale: bytes over a host's link per step, 2 to 1,024 workers (modelled)", "",
           f"GPT-2 small's parameters ({params:,} in {len(shapes)} tensors), every tensor reduced with the "
           "pattern `pattern=auto` picks at the link rate (`hvd_gradq/plan/decide.py::decide`: link bytes "
           "plus the measured encode/decode CPU of `plan/cpu_table.py`; small tensors fp32). Two topologies: "
           "one rank a host, and 8 ranks a host (N <= 8 is then one host, where the frontends do not use "
           "`hierarchical`). A host's bytes are max(sent, received) over its link per tensor, summed; fp32/fp16 are "
           "Horovod's ring allreduce. Generated by `.venv/bin/python bench/scale/scale_model.py`; the model's bytes "
           "were checked on emulated links at 2, 4, 8 hosts and 2 hosts x 2 ranks (`results/scale/scale_emulated.md`), "
           "beyond that modelled.", ""]
    misses = []
    for gbps in (1.0, MAIN_RATE, 100.0):
        out += [f"## Chosen pattern's bytes as a fraction of fp16 ring allreduce, auto at {gbps:g} Gbit/s "
                "(target: <= 0.25 below 4 bits)", "", f"| scheme | topology | {head} | met? |",
                "|---|---|" + "---:|" * len(NS) + "---|"]
        for spec in SCHEMES:
            for per_host, tname in TOPOLOGIES.items():
                fr = [rows[spec][(per_host, n)]["rates"][gbps]["bytes"] / rows["fp16"][n]["bytes"] for n in NS]
                ok = max(fr) <= 0.25
                if spec in BELOW_4_BITS and not ok:
                    misses.append((LABELS[spec], tname, gbps, [n for n, f in zip(NS, fr) if f > 0.25], max(fr)))
                met = ("yes" if ok else "**no**") if spec in BELOW_4_BITS else "(4 bits: not a target)"
                out.append(f"| {LABELS[spec]} | {tname} | " + " | ".join(f"{f:.3f}" for f in fr) + f" | {met} |")
        out.append("")
    out += [f"## The pattern `auto` picks at {MAIN_RATE:g} Gbit/s (tensors per pattern, of {len(shapes)})", "",
            f"| scheme | topology | {head} |", "|---|---|" + "---|" * len(NS)]
    for spec in SCHEMES:
        for per_host, tname in TOPOLOGIES.items():
            cells = [", ".join(f"{k} {v}" for k, v in sorted(rows[spec][(per_host, n)]["rates"][MAIN_RATE]["patterns"]
                                                            .items())) for n in NS]
            out.append(f"| {LABELS[spec]} | {tname} | " + " | ".join(cells) + " |")
    out += ["", "## Each pattern forced (MB over a host's link per step)", "",
            f"| scheme | topology | pattern | {head} |", "|---|---|---|" + "---:|" * len(NS)]
    for base in ("fp32", "fp16"):
        out.append(f"| Horovod {base} | any | ring | " + " | ".join(
            f"{rows[base][n]['bytes'] / 1e6:.1f}" for n in NS) + " |")
    for spec in SCHEMES:
        for per_host, tname in TOPOLOGIES.items():
            for p in FORCED:
                cells = [rows[spec][(per_host, n)]["forced"].get(p.value) for n in NS]
                if any(c is not None for c in cells):
                    out.append(f"| {LABELS[spec]} | {tname} | {p.value} | " + " | ".join(
                        "–" if c is None else f"{c / 1e6:.1f}" for c in cells) + " |")
    out += ["", "## Modelled step time of the reduction against Horovod fp16 (fp16 time / scheme time; "
            "> 1 is faster; link time + encode/decode CPU, no overlap)", ""]
    for rname, gbps in RATES.items():
        out += [f"**{rname}**", "", f"| scheme | topology | {head} |", "|---|---|" + "---:|" * len(NS)]
        for spec in SCHEMES:
            for per_host, tname in TOPOLOGIES.items():
                cells = [rows["fp16"][n]["bytes"] * 8 / (gbps * 1e9)
                         / rows[spec][(per_host, n)]["rates"][gbps]["seconds"] for n in NS]
                out.append(f"| {LABELS[spec]} | {tname} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
        out.append("")
    out += ["## Where the target is missed", ""]
    for label, tname, gbps, ns, worst in misses:
        out.append(f"- {label}, {tname}, auto at {gbps:g} Gbit/s: above 1/4 of fp16 at N = "
                   f"{', '.join(map(str, ns))} (worst {worst:.3f}).")
    if not misses:
        out.append("- none")
    out += ["", "![bytes over a host's link per step](scale.png)", ""]
    return "\n".join(out)


def plot(rows: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    for ax, (per_host, tname) in zip(axes, TOPOLOGIES.items()):
        for base, style in (("fp32", "k-"), ("fp16", "k--")):
            ax.plot(NS, [rows[base][n]["bytes"] / 1e6 for n in NS], style, label=f"Horovod {base} ring", lw=2)
        ax.plot(NS, [rows["fp16"][n]["bytes"] / 4e6 for n in NS], "k:", label="1/4 of fp16 (target)")
        for spec in SCHEMES:
            ax.plot(NS, [rows[spec][(per_host, n)]["rates"][MAIN_RATE]["bytes"] / 1e6 for n in NS], "o-", ms=3,
                    label=LABELS[spec])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_title(f"GPT-2 small (124M), {tname}, auto at {MAIN_RATE:g} Gbit/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("MB over a host's link per step (max of sent, received)")
    axes[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "results" / "scale" / "scale.md"))
    args = ap.parse_args()
    shapes = gpt2_small()
    rows = model(shapes)
    out = Path(args.out)
    out.write_text(report(rows, shapes))
    plot(rows, out.with_name("scale.png"))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
