"""Tables and plots of the quality study (``bench/quality/study.py``): ``results/quality/quality.md`` and one
plot a block (workload x workers) of the reported metric against bytes a rank sends a step.

How a row is made: for each scheme, the learning rate with the best mean ``dev`` metric over
the seeds is chosen (held-out data that is not the test set); the row reports that rate's
``test`` metric, mean and 95% t-interval over seeds, and its difference from Horovod's fp32 run
at *its own* best rate as a mean of per-seed differences with its own 95% interval (a seed fixes
the init and the data order for both). A diverged run counts as 0% accuracy / infinite loss.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "quality"

#: (task, spec, allowed gap): accuracy points for mnist1d, relative loss for chars
TARGETS = {
    "mnist1d": [("orq:levels=5", 0.5), ("orq:levels=3", 1.0), ("bingrad:ef=true", 1.0)],
    "chars": [("orq:levels=5", 0.01), ("uniform:bits=4", 0.01), ("orq:levels=3", 0.03), ("bingrad:ef=true", 0.03)],
}


def t95(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) if n > 1 else math.inf


def ci(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, float)
    if len(a) < 2 or not np.all(np.isfinite(a)):
        return float(a.mean()), math.inf
    return float(a.mean()), t95(len(a)) * float(a.std(ddof=1)) / math.sqrt(len(a))


def rows_of(runs: list[dict[str, Any]], higher: bool) -> dict[str, dict[str, Any]]:
    """spec -> its row (best rate by mean dev metric, that rate's test values by seed)."""
    by: dict[str, dict[float, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        if "error" not in r:
            by[r["spec"]][r["lr"]][r["seed"]] = r
    out = {}
    for spec, lrs in by.items():
        seeds = set.intersection(*(set(v) for v in lrs.values()))
        if not seeds:
            continue
        score = {lr: float(np.mean([v[s]["dev"] for s in seeds])) for lr, v in lrs.items()}
        best = (max if higher else min)(score, key=lambda lr: score[lr] if math.isfinite(score[lr]) else -math.inf
                                        if higher else math.inf)
        chosen = lrs[best]
        out[spec] = {
            "spec": spec, "lr": best, "lrs": sorted(lrs), "seeds": sorted(seeds),
            "test": {s: chosen[s]["test"] for s in seeds},
            "by_lr": {lr: ci([v[s]["test"] for s in seeds]) for lr, v in lrs.items()},
            "diverged": {lr: sum(v[s]["diverged"] for s in seeds) for lr, v in lrs.items()},
            "sent": float(np.mean([chosen[s]["sent_per_step"] for s in seeds])),
            "fp32": float(np.mean([chosen[s]["fp32_per_step"] for s in seeds])),
            "patterns": chosen[min(seeds)]["patterns"] or ["fp16"],
            "params": chosen[min(seeds)]["params"],
            "wall": sum(v[s]["wall_s"] for v in lrs.values() for s in seeds),
        }
    return out


def _fmt(v: float, higher: bool) -> str:
    return f"{v:.2f}" if higher else f"{v:.4f}"


def block_table(task: str, workers: int, rows: dict[str, dict[str, Any]], order: list[str]) -> list[str]:
    from bench.quality.study_tasks import TASKS

    t = TASKS[task]
    higher = t.higher_is_better
    base = rows.get("none")
    unit = "points" if higher else "relative"
    lines = [
        f"| scheme | best lr | {t.metric}: mean ± 95% CI | min – max | Δ vs fp32 ({unit}), paired, ± 95% CI "
        f"| bytes a rank sends / step | x less than fp32 | patterns | mean {t.metric} at each lr (diverged runs) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for spec in order:
        row = rows.get(spec)
        if row is None:
            lines.append(f"| `{spec}` | – | not run yet | | | | | | |")
            continue
        vals = [row["test"][s] for s in row["seeds"]]
        m, h = ci(vals)
        delta = "—"
        if base is not None and spec != "none":
            common = sorted(set(row["seeds"]) & set(base["seeds"]))
            d = [row["test"][s] - base["test"][s] for s in common]
            if not higher:
                d = [x / base["test"][s] for x, s in zip(d, common)]
            dm, dh = ci(d)
            delta = f"{dm:+.2f} ± {dh:.2f}" if higher else f"{100 * dm:+.2f}% ± {100 * dh:.2f}%"
        by = "; ".join(f"{lr:g}: {_fmt(v[0], higher)}" + (f" ({row['diverged'][lr]})" if row["diverged"][lr] else "")
                       for lr, v in sorted(row["by_lr"].items()))
        ratio = row["fp32"] / row["sent"] if row["sent"] else math.inf
        lines.append(
            f"| `{spec}` | {row['lr']:g} | {_fmt(m, higher)} ± {_fmt(h, higher)} (n={len(vals)}) "
            f"| {_fmt(min(vals), higher)} – {_fmt(max(vals), higher)} | {delta} | {row['sent']:,.0f} | {ratio:.1f} "
            f"| {', '.join(row['patterns'])} | {by} |")
    return lines


def verdicts(task: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    from bench.quality.study_tasks import TASKS

    higher = TASKS[task].higher_is_better
    base = rows.get("none")
    out = []
    for spec, gap in TARGETS.get(task, []):
        row = rows.get(spec)
        if row is None or base is None:
            out.append(f"- `{spec}` within {gap:g}: not measured yet")
            continue
        m, bm = float(np.mean(list(row["test"].values()))), float(np.mean(list(base["test"].values())))
        if higher:
            short = bm - m
            ok = short <= gap
            out.append(f"- `{spec}` within {gap:g} point of fp32: **{'met' if ok else 'NOT met'}** "
                       f"({m:.2f}% vs {bm:.2f}%, {-short:+.2f} points)")
        else:
            rel = (m - bm) / bm
            ok = rel <= gap
            out.append(f"- `{spec}` within {100 * gap:g}% of fp32's loss: **{'met' if ok else 'NOT met'}** "
                       f"({m:.4f} vs {bm:.4f}, {100 * rel:+.2f}%)")
    return out


def recipe_effects(task: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    """What each ingredient of the recipe does: a row against the same scheme without it (error
    feedback, warm-up, clipping), both at their own best rates, as a paired per-seed difference."""
    from bench.quality.study_tasks import TASKS

    higher = TASKS[task].higher_is_better
    pairs = []
    for spec in rows:
        parts = spec.split(":", 1)
        opts = parts[1].split(",") if len(parts) > 1 else []
        for i, o in enumerate(opts):
            if o.startswith(("warmup=", "clip=")) or o == "ef=true":
                rest = opts[:i] + opts[i + 1:]
                if o == "ef=true" and parts[0] == "bingrad":  # BinGrad's default is ef=true
                    rest = rest + ["ef=false"]
                base = parts[0] + (":" + ",".join(rest) if rest else "")
                if base in rows:
                    pairs.append((base, spec, o))
    if not pairs:
        return []
    unit = "points" if higher else "relative loss"
    out = [f"| scheme | with | its best lr → with's | Δ ({unit}), paired, ± 95% CI |", "|---|---|---|---:|"]
    for base, spec, o in pairs:
        b, w = rows[base], rows[spec]
        common = sorted(set(b["seeds"]) & set(w["seeds"]))
        d = [w["test"][s] - b["test"][s] for s in common]
        if not higher:
            d = [x / b["test"][s] for x, s in zip(d, common)]
        dm, dh = ci(d)
        txt = f"{dm:+.2f} ± {dh:.2f}" if higher else f"{100 * dm:+.2f}% ± {100 * dh:.2f}%"
        out.append(f"| `{base}` | `{o}` | {b['lr']:g} → {w['lr']:g} | {txt} |")
    return out


def plot(task: str, workers: int, rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.quality.study_tasks import TASKS

    t = TASKS[task]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for spec, row in rows.items():
        m, h = ci([row["test"][s] for s in row["seeds"]])
        if not math.isfinite(m):
            continue
        warm = "warmup" in spec
        ax.errorbar(row["sent"], m, yerr=h if math.isfinite(h) else None, fmt="s" if warm else "o", capsize=3,
                    color="black" if spec in ("none", "fp16") else None)
        ax.annotate(spec.replace(",ef=true", "+EF").replace(":levels=", "-"), (row["sent"], m), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("bytes a rank sends a step (log)")
    ax.set_ylabel(f"{t.metric} (mean, 95% CI)")
    ax.set_title(f"{task}, {workers} workers: each scheme at its best learning rate")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: the summary's rows: the baselines, the defaults of gq.ORQ() and gq.BinGrad(), the targets' schemes
SUMMARY = ["fp16", "orq:levels=5", "orq:levels=3", "bingrad:ef=true", "uniform:bits=4", "orq:levels=9"]


def summary(blocks: list[tuple[str, int, dict[str, dict[str, Any]]]]) -> list[str]:
    """One line a scheme, one column a block: Δ vs fp32 (paired, 95% CI) and bytes x less."""
    from bench.quality.study_tasks import TASKS

    head = ["scheme"] + [f"{task}, {workers} workers" for task, workers, _ in blocks]
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(blocks) + "|"]
    for spec in SUMMARY:
        cells = [f"`{spec}`"]
        for task, _, rows in blocks:
            higher = TASKS[task].higher_is_better
            row, base = rows.get(spec), rows.get("none")
            if row is None or base is None:
                cells.append("–")
                continue
            common = sorted(set(row["seeds"]) & set(base["seeds"]))
            d = [row["test"][s] - base["test"][s] for s in common]
            if not higher:
                d = [x / base["test"][s] for x, s in zip(d, common)]
            dm, dh = ci(d)
            txt = f"{dm:+.2f} ± {dh:.2f} pt" if higher else f"{100 * dm:+.2f}% ± {100 * dh:.2f}%"
            cells.append(f"{txt} ({row['fp32'] / row['sent']:.1f}x less)")
        out.append("| " + " | ".join(cells) + " |")
    return out


def before_and_after(task: str, workers: int, rows: dict[str, dict[str, Any]], main_saved: list[dict[str, Any]],
                     order: list[str]) -> list[str]:
    """Each row of a rerun against the same (task, workers, scheme, rate) in the main study (the
    old second phase, ``refined(sqrt(N))``): Δ vs fp32 (each study against its own fp32 runs),
    bytes a rank sends a step and the patterns, side by side."""
    from bench.quality.study_tasks import TASKS

    higher = TASKS[task].higher_is_better
    main_runs = [r for r in main_saved if r["task"] == task and r["workers"] == workers and "error" not in r]
    main_base = rows_of([r for r in main_runs if r["spec"] == "none"], higher).get("none")

    def delta(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
        if row is None or base is None:
            return "–"
        common = sorted(set(row["seeds"]) & set(base["seeds"]))
        d = [row["test"][s] - base["test"][s] for s in common]
        if not higher:
            d = [x / base["test"][s] for x, s in zip(d, common)]
        dm, dh = ci(d)
        return f"{dm:+.2f} ± {dh:.2f}" if higher else f"{100 * dm:+.2f}% ± {100 * dh:.2f}%"

    out = ["| scheme | workers | lr | Δ vs fp32 ± 95% CI | before: Δ vs fp32 ± 95% CI | bytes a rank sends / step "
           "(x less than fp32) | before: bytes (x less) | patterns | before: patterns |",
           "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for spec in order:
        row = rows.get(spec)
        if row is None:
            continue
        old_runs = [r for r in main_runs if r["spec"] == spec and r["lr"] == row["lr"]]
        old = rows_of(old_runs, higher).get(spec)
        old_bytes = f"{old['sent']:,.0f} ({old['fp32'] / old['sent']:.1f}x)" if old else "–"
        out.append(f"| `{spec}` | {workers} | {row['lr']:g} | {delta(row, rows.get('none'))} | {delta(old, main_base)} "
                   f"| {row['sent']:,.0f} ({row['fp32'] / row['sent']:.1f}x) | {old_bytes} "
                   f"| {', '.join(row['patterns'])} | {', '.join(old['patterns']) if old else '–'} |")
    return out


def write(runs: list[dict[str, Any]], saved: list[dict[str, Any]], tag: str = "", plan: str = "main",
          raw: Path | None = None) -> None:
    from bench.quality.study_store import RunStore
    from bench.quality.study_tasks import TASKS

    shown_tag = " --tag " + tag if tag and plan == "main" else ""
    blocks: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in runs:
        if r["spec"] not in blocks[(r["task"], r["workers"])]:
            blocks[(r["task"], r["workers"])].append(r["spec"])
    head = [
        "# Quality study: each scheme at its own best learning rate, 5 seeds, fp32 and fp16 baselines" if plan == "main"
        else f"# Quality study, plan `{plan}`: each scheme at its best rate in the main study, fp32 and fp16 baselines",
        "",
        f"Generated by `.venv/bin/python bench/quality/study.py --plan {plan}{shown_tag}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}); "
        "`--report` rewrites this file from the saved runs "
        f"(`{(raw or OUT / 'study_runs' / 'main.jsonl.gz').relative_to(ROOT)}`). Workloads and settings: "
        "`bench/quality/study_tasks.py`; simulated workers: `bench/quality/sim_reduce.py` (the PyTorch frontend's "
        "reduction in one process, checked bit for bit against `DistributedOptimizer` by "
        "`tests/parallel/test_torch_compat.py::test_quality_study_simulator_gives_the_frontends_bits`). Rows "
        "(`bench/quality/study_report.py`): the rate with the best mean on held-out `dev` data, then that rate's test "
        "metric; Δ is the mean per-seed difference from the fp32 run at its own best rate. `none` is Horovod's "
        "fp32 allreduce, `fp16` Horovod's `Compression.fp16`; schemes run with `pattern=auto` (the patterns column "
        "is what the policy chose; `fp32` there means tiny tensors sent uncompressed).",
        "",
    ]
    done = []
    body: list[str] = []
    for (task, workers), order in blocks.items():
        rows = rows_of([r for r in saved if r["task"] == task and r["workers"] == workers],
                       TASKS[task].higher_is_better)
        if not rows:
            continue
        done.append((task, workers, rows))
        n = sum(1 for r in saved if r["task"] == task and r["workers"] == workers)
        planned = sum(1 for r in runs if r["task"] == task and r["workers"] == workers)
        body += [f"## {task}, {workers} workers ({n} of {planned} planned runs saved)", ""]
        body += block_table(task, workers, rows, order)
        body += ["", "Targets (means over seeds):", ""] + verdicts(task, rows) + [""]
        if plan != "main":
            main_saved = list(RunStore(OUT / "study_runs" / "main.jsonl.gz").runs.values())
            body += ["Against the main study's runs of the same scheme at the same rate (`results/quality/quality.md`, "
                     "the old second phase `refined(sqrt(N))`; each Δ against its own study's fp32 runs):", ""]
            body += before_and_after(task, workers, rows, main_saved, order) + [""]
        effects = recipe_effects(task, rows)
        if effects:
            body += ["The recipe's ingredients, each against the same scheme without it:", ""] + effects + [""]
        png = OUT / f"quality{tag}_{task}_w{workers}.png"
        plot(task, workers, rows, png)
        body += [f"![{task}, {workers} workers]({png.name})", ""]
    lines = head + ["## Summary: Δ vs fp32 at each scheme's best rate (accuracy points; relative test loss)", ""]
    lines += summary(done) + [""] + body
    (OUT / f"quality{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
