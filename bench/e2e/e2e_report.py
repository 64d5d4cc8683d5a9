"""The report of :mod:`bench_e2e`: the Markdown tables (step time, bytes, targets) and the plot."""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any, Optional

from bench.e2e.e2e_worker import ENTRIES, HIDDEN


def fmt_mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def byte_errors(r: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per host: (TCP payload sent / stats sent - 1), and the payload beyond stats in bytes per
    second of the phase (to compare with Horovod's own negotiation rate when idle)."""
    raw = [p / st - 1 for p, st in zip(r["payload_sent"], r["stats_sent"])]
    steps = len(r["step_times"])
    excess = [(p - st) * steps / r["phase_s"] for p, st in zip(r["payload_sent"], r["stats_sent"])]
    return raw, excess


def report(runs: list[dict[str, Any]], args: argparse.Namespace, cmd: str, fig: str = "e2e_step_time.png") -> str:
    pinned = bool(runs[0].get("pinned"))
    lines = [f"# End-to-end: step time and bytes on an emulated {args.hosts}-host network", ""]
    cpu = ("each host's rank pinned to a core of its own (`taskset`, `--pin`): hosts share no CPU time, so "
           "**ideal** = max(compute alone, the busier direction of the host's wire bytes / bandwidth) is the step a "
           "perfect overlap of compute and communication would take, and step / ideal how far from it we are."
           if pinned else
           f"All rows of a bandwidth ran in one launch, on a {os.cpu_count()}-core machine running all "
           f"{args.hosts} ranks: CPU time is shared, so compute and compression cost more than a host of its "
           "own would pay.")
    p = runs[0]["params"]
    lines += [
        f"{args.hosts} hosts (network namespaces on a bridge, each link shaped by `tc tbf` both ways; "
        f"`bench/netemu/`), one rank a host, Horovod over Gloo. Model: MLP 40-{HIDDEN}-{HIDDEN}-"
        f"{HIDDEN}-10, **{p / 1e6:.2f}M parameters** ({p * 4 / 1e6:.1f} MB of fp32 gradients), Adam, batch "
        f"{args.batch} a rank, MNIST-1D. Step = forward + backward + communication + optimizer step; the "
        f"time is the slowest rank's, mean of {args.steps} timed steps after {args.warmup} warm-up steps. " + cpu,
        "",
        "Bytes, per host and step, from the kernel's counters of each host's link (`/proc/net/dev` in its "
        "namespace): **wire** = bytes sent, headers included; **payload** = wire minus 66 bytes "
        "(Ethernet + IPv4 + TCP with timestamps) per packet sent, i.e. the TCP payload (ACKs carry none); "
        "**stats** = what the compressor's `stats()` says this rank sent. **payload/stats** is the ratio "
        "(mean over hosts, and the host furthest from 1); **excess kB/s** is the payload beyond stats per "
        "second of the phase (worst host), to set against Horovod's own background negotiation (request "
        "and response lists every cycle), measured in an idle phase of the same run: what crosses besides "
        "the compressed gradients is Horovod's control traffic, so it grows with the step time, not with "
        "the payload.",
        "",
        f"Reproduce (root): `{cmd}`",
        "",
    ]
    for run in runs:
        base = run["schemes"].get("none (Horovod fp32)", {}).get("step_s")
        ch = _mean(run["chatter_Bps"])
        lines += [f"## {run['rate']}", "",
                  f"Compute alone (no communication): {run['compute_s'] * 1e3:.0f} ms a step. Horovod's "
                  f"background negotiation when idle: {ch / 1e3:.1f} kB/s a host. Load average at the end: "
                  f"{run['load'][0]:.1f}.", "",
                  "| scheme | step s | speed-up vs none | ideal s | step / ideal | wire MB | payload MB | stats MB | "
                  "payload/stats (worst host) | excess kB/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, r in run["schemes"].items():
            su = f"{base / r['step_s']:.2f}x" if base else "-"
            ideal = ideal_s(run, r)
            cells = [f"{r['step_s']:.3f}", su, f"{ideal:.3f}", f"{r['step_s'] / ideal:.2f}",
                     fmt_mb(_mean(r["wire_sent"])), fmt_mb(_mean(r["payload_sent"]))]
            if "stats_sent" in r and all(r["stats_sent"]):
                raw, excess = byte_errors(r)
                cells += [fmt_mb(_mean(r["stats_sent"])),
                          f"{1 + _mean(raw):.3f} ({max(raw, key=abs) * 100:+.1f}%)",
                          f"{max(excess) / 1e3:.0f}"]
            else:
                cells += ["-", "-", "-"]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += targets(run)
        tta = [(label, tta_runs(r["tta"])) for label, r in run["schemes"].items() if "tta" in r]
        if tta:
            seeds = max(len(runs) for _, runs in tta)
            lines += ["", f"Time to {args.tta_target * 100:.0f}% test accuracy (fresh model, at most "
                      f"{args.tta_steps} steps, accuracy checked every {args.tta_every} steps; training time "
                      f"only, slowest rank; {seeds} seed(s), the same for every scheme; median of the seeds "
                      "that reached it, and the ratio to Horovod fp16's median):", "",
                      "| scheme | reached | median s | each seed s | median steps | vs Horovod fp16 | "
                      "best accuracy seen |", "|---|---:|---:|---|---:|---:|---:|"]
            base = dict(tta).get("Horovod fp16")
            base_s = tta_median(base)[0] if base else None
            for label, runs in tta:
                best = max((c[2] for t in runs for c in t["curve"]), default=0.0)
                med_s, med_steps = tta_median(runs)
                each = ", ".join(f"{t['reached'][1]:.1f}" if t["reached"] else "-" for t in runs)
                got = sum(1 for t in runs if t["reached"])
                ratio = f"{base_s / med_s:.2f}x" if base_s and med_s else "-"
                lines.append(f"| {label} | {got}/{len(runs)} | {fmt_opt(med_s)} | {each} | "
                             f"{fmt_opt(med_steps, 0)} | {ratio} | {best * 100:.1f}% |")
        lines.append("")
    lines += [f"![step time per scheme and bandwidth]({fig})", ""]
    return "\n".join(lines)


def tta_runs(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The seeds' runs of a time-to-accuracy result (older results hold one run, unwrapped)."""
    return list(t["runs"]) if "runs" in t else [t]


def tta_median(runs: list[dict[str, Any]] | None) -> tuple[float | None, float | None]:
    """(median seconds, median steps) over the seeds that reached the target, or (None, None)
    when fewer than half did (a median of the lucky ones would flatter the scheme)."""
    done = sorted((t["reached"][1], t["reached"][0]) for t in runs or [] if t["reached"])
    if not runs or 2 * len(done) < len(runs):
        return None, None
    return statistics.median(s for s, _ in done), statistics.median(k for _, k in done)


def fmt_opt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ideal_s(run: dict[str, Any], r: dict[str, Any]) -> float:
    """max(compute alone, the busier direction of the busiest host's wire bytes at the link rate)."""
    wire = max(max(r["wire_sent"]), max(r.get("wire_recv") or [0.0]))
    return max(run["compute_s"], wire * 8.0 / run["rate_bps"])


def targets(run: dict[str, Any]) -> list[str]:
    s = run["schemes"]
    out = ["Targets (ratios within this run):", ""]

    def t(label: str) -> Optional[float]:
        return s[label]["step_s"] if label in s else None

    none, hfp16 = t("none (Horovod fp32)"), t("Horovod fp16")
    if run["rate"].lower().startswith("100m") and none:
        for lab in ("ORQ-3", "ORQ-5", "BinGrad+EF"):
            if t(lab):
                r = none / t(lab)  # type: ignore[operator]
                out.append(f"- {lab} >= 3x faster than none: {r:.2f}x, **{'met' if r >= 3 else 'not met'}**")
        if hfp16:
            for e in ENTRIES:
                if e.kind == "gradq" and e.bits <= 4 and t(e.label):
                    r = hfp16 / t(e.label)  # type: ignore[operator]
                    out.append(f"- {e.label} >= 2x faster than Horovod fp16: {r:.2f}x, "
                               f"**{'met' if r >= 2 else 'not met'}**")
    if run["rate"].lower().startswith("1g") and hfp16:
        for lab in ("ORQ-3", "ORQ-5"):
            if t(lab):
                r = hfp16 / t(lab)  # type: ignore[operator]
                out.append(f"- {lab} >= 2x faster a step than Horovod fp16 ({t(lab):.3f} s vs {hfp16:.3f} s, "
                           f"{r:.2f}x): **{'met' if r >= 2 else 'not met'}**")
        base = tta_median(tta_runs(s["Horovod fp16"]["tta"]))[0] if "tta" in s["Horovod fp16"] else None
        for lab in ("ORQ-5", "BinGrad+EF"):
            if base and lab in s and "tta" in s[lab]:
                med = tta_median(tta_runs(s[lab]["tta"]))[0]
                r = base / med if med else 0.0
                out.append(f"- {lab} >= 2x faster to the accuracy target than Horovod fp16 (median of the seeds): "
                           f"{r:.2f}x, **{'met' if r >= 2 else 'not met'}**")
    if run.get("pinned"):
        comp = {label: r for label, r in s.items() if any(e.label == label and e.kind == "gradq" for e in ENTRIES)}
        if comp:
            worst = max(comp.items(), key=lambda kv: kv[1]["step_s"] / ideal_s(run, kv[1]))
            ok = all(r["step_s"] <= 2.0 * ideal_s(run, r) for r in comp.values())
            out.append(f"- every hvd_gradq scheme's step within 2x of its ideal: **{'met' if ok else 'not met'}** "
                       f"(worst: {worst[0]}, {worst[1]['step_s'] / ideal_s(run, worst[1]):.2f}x)")
    errs = {label: byte_errors(r) for label, r in s.items() if "stats_sent" in r and all(r["stats_sent"])}
    if errs:
        within = [label for label, (raw, _) in errs.items() if max(abs(e) for e in raw) <= 0.05]
        beyond = {label: max(ex) for label, (raw, ex) in errs.items() if label not in within}
        idle = max(run["chatter_Bps"])
        line = (f"- TCP payload that crossed each link within 5% of `stats()`: **met for {len(within)} of "
                f"{len(errs)} schemes** ({', '.join(within)})")
        if beyond:
            rates = ", ".join(f"{v / 1e3:.0f}" for v in beyond.values())
            below = all(v <= idle for v in beyond.values())
            line += (f"; not for {', '.join(beyond)}, whose excess ({rates} kB/s) is "
                     + ("below" if below else "NOT below")
                     + f" Horovod's idle negotiation rate ({idle / 1e3:.0f} kB/s, busiest host)"
                     + (": their steps are the longest for their payload" if below else ""))
        out.append(line)
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs[0]["schemes"])
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5.5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        vals = [run["schemes"][lab]["step_s"] for lab in labels]
        colors = ["#999999" if ("Horovod" in lab or "DDP" in lab or lab.startswith("none")) else "#1f77b4"
                  for lab in labels]
        ax.barh(labels[::-1], vals[::-1], color=colors[::-1])
        ax.axvline(run["compute_s"], color="k", ls=":", lw=1, label="compute alone")
        ax.set_xlabel(f"step time, s (slowest of {len(run['chatter_Bps'])} ranks)")
        ax.set_title(f"{run['rate']} links, {run['params'] / 1e6:.1f}M parameters")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


