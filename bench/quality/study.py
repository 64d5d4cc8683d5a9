"""The quality study: every scheme x learning rate x seed on two workloads, simulated workers.

Each run trains a workload of :mod:`study_tasks` with ``--workers`` data-parallel workers whose
gradients are reduced as the PyTorch frontend reduces them (:mod:`sim_reduce`: the library's
policy, payloads, patterns and error feedback, in one process, so that hundreds of runs fit a
small machine). A row whose best rate is at the edge of the grid gets the rates beyond it
(:func:`beyond_edges`). Every finished run is saved at once in ``results/quality/study_runs/main.jsonl.gz``
(committed; :mod:`study_store`) and a rerun skips what is saved, so an interrupted study resumes.
``--jobs`` runs go in parallel (one process each). The tables and plots are :mod:`study_report`'s.

    .venv/bin/python bench/quality/study.py --plan main          # the whole grid (hours on 2 cores)
    .venv/bin/python bench/quality/study.py --plan main --report # tables and plots from what is saved
    .venv/bin/python bench/quality/study.py --plan second_phase  # issue 24's rerun: quality_second_phase.md

``--plan second_phase`` reruns the schemes whose scatter/hierarchical second phase changed (now
stochastic uniform, :func:`hvd_gradq.plan.second_phase.reduced_scheme`) with the fp32 and fp16
baselines, MNIST-1D at 4 and 8 workers, 5 seeds, each at the rate that was best for it in the
main study's saved runs (no grid); its runs go to ``results/quality/study_runs/second_phase.jsonl.gz``
and its report to ``results/quality/quality_second_phase.md``, beside the main study's figures.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench.quality.study_store import RunStore  # noqa: E402

RAW = ROOT / "results" / "quality" / "study_runs" / "main.jsonl.gz"
_STORE: RunStore | None = None


def store() -> RunStore:
    global _STORE
    if _STORE is None or _STORE.path != RAW:
        _STORE = RunStore(RAW)
    return _STORE

#: every scheme of the tables (Horovod's fp32 and fp16 baselines first), those with targets next
KEY = ["none", "fp16", "orq:levels=5", "orq:levels=3", "bingrad:ef=true", "uniform:bits=4"]
REST = ["orq:levels=9", "bingrad:variant=pb,ef=true", "qsgd:levels=4", "terngrad", "sign:ef=true",
        "topk:ratio=0.01,ef=true", "bingrad:ef=false"]
#: the recipe's candidates: a full-precision warm-up of 10% of the steps, clipping (the paper's)
RECIPE = ["orq:levels=3,warmup=30", "bingrad:ef=true,warmup=30", "orq:levels=3,clip=2.5", "orq:levels=5,clip=2.5"]
SCHEMES = KEY + REST + RECIPE
#: the transformer's rows: the baselines and the schemes its targets name
CHARS = ["none", "fp16", "orq:levels=5", "uniform:bits=4", "orq:levels=3", "bingrad:ef=true"]
#: issue 24's rerun after the second phase changed: the summary's schemes with both baselines, and
#: ORQ-9 and ORQ-3 with the scatter pattern asked for (``spec@pattern``: on MNIST-1D's small tensors
#: auto sends ORQ-9 by gather, so its rows alone would not exercise the second phase)
SECOND_PHASE = KEY + ["orq:levels=9", "orq:levels=9@scatter", "orq:levels=3@scatter"]
#: plans run at one rate a row, the best of the main study's saved runs: no grid, no edges
AT_BEST_RATE = {"second_phase"}
#: plans with their own file of runs (results/quality/study_runs/<name>.jsonl.gz) and report (quality_<name>.md)
OWN_FILES = {"second_phase"}


def best_rate(task: str, workers: int, spec: str) -> float:
    """The rate with the best mean ``dev`` over seeds among the main study's saved runs of a row."""
    import numpy as np

    from bench.quality.study_tasks import TASKS

    spec = spec.partition("@")[0]  # a pattern asked for runs at the scheme's rate under auto
    saved = [r for r in RunStore(ROOT / "results" / "quality" / "study_runs" / "main.jsonl.gz").runs.values()
             if r["task"] == task and r["workers"] == workers and r["spec"] == spec and "error" not in r]
    if not saved:
        raise SystemExit(f"no saved main-study runs of {task}, {workers} workers, {spec}: run --plan main first")
    sign = 1.0 if TASKS[task].higher_is_better else -1.0
    by: dict[float, list[float]] = {}
    for r in saved:
        by.setdefault(r["lr"], []).append(r["dev"])
    score = {lr: sign * float(np.mean(v)) if np.all(np.isfinite(v)) else -np.inf for lr, v in by.items()}
    return max(score, key=lambda lr: score[lr])


def plan(name: str, seeds: int) -> list[dict[str, Any]]:
    """The runs of a plan, most important first (an interrupted study has whole rows)."""
    from bench.quality.study_tasks import TASKS

    blocks: list[tuple[str, int, list[str]]] = {
        "main": [("mnist1d", 4, KEY + RECIPE), ("chars", 4, CHARS),
                 ("chars", 4, ["orq:levels=3,warmup=15", "bingrad:ef=true,warmup=15"]), ("mnist1d", 4, REST),
                 ("mnist1d", 8, KEY + RECIPE + REST)],
        "baselines": [("chars", 4, ["none", "fp16"]), ("mnist1d", 8, ["none", "fp16"])],
        "smoke": [("mnist1d", 4, ["none", "orq:levels=3"])],
        "second_phase": [("mnist1d", 4, SECOND_PHASE), ("mnist1d", 8, SECOND_PHASE)],
    }[name]
    runs = []
    for task, workers, specs in blocks:
        for spec in specs:
            lrs = [best_rate(task, workers, spec)] if name in AT_BEST_RATE else TASKS[task].lrs
            for seed in range(seeds):
                for lr in lrs:
                    runs.append({"task": task, "workers": workers, "spec": spec, "lr": lr, "seed": seed})
    return runs


def beyond_edges(runs: list[dict[str, Any]], rounds: int = 2) -> list[dict[str, Any]]:
    """The grid's extension: a row (task, workers, scheme) whose best rate on ``dev`` is the
    smallest or largest it has tried also gets the next rate beyond it (half or double), for every
    seed, until its best is inside its grid (at most ``rounds`` steps out). Without it a scheme
    whose best rate lies off the shared grid would be judged at a rate tuned for another. Decided
    from saved runs only, so ``--report`` rebuilds the same plan."""
    import numpy as np

    from bench.quality.study_tasks import TASKS

    extra: list[dict[str, Any]] = []
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["workers"], r["spec"]), []).append(r)
    for (task, workers, spec), rs in groups.items():
        higher = TASKS[task].higher_is_better
        seeds = sorted({r["seed"] for r in rs})
        lrs = sorted({r["lr"] for r in rs})
        for _ in range(rounds):
            saved = {(r["lr"], r["seed"]): store().get(r) for r in rs if store().has(r)}
            if len(saved) < len(lrs) * len(seeds) or any("error" in v for v in saved.values()):
                break  # the row is not complete (or a run failed): nothing to decide yet
            score = {lr: float(np.mean([saved[(lr, s)]["dev"] for s in seeds])) for lr in lrs}
            key = {lr: (score[lr] if higher else -score[lr]) if np.isfinite(score[lr]) else -np.inf for lr in lrs}
            best = max(lrs, key=lambda lr: key[lr])
            if best == lrs[0]:
                nxt = best / 2
            elif best == lrs[-1]:
                nxt = best * 2
            else:
                break
            new = [{"task": task, "workers": workers, "spec": spec, "lr": nxt, "seed": s} for s in seeds]
            rs, lrs = rs + new, sorted(lrs + [nxt])
            extra += new
    return extra


_DATA: dict[str, Any] = {}


def _one(r: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    from bench.quality import study_train
    from bench.quality.study_tasks import TASKS, load_data

    if r["task"] not in _DATA:
        _DATA[r["task"]] = load_data(TASKS[r["task"]])
    spec, _, pattern = r["spec"].partition("@")  # "spec@pattern": that pattern asked for, else auto
    try:
        out = study_train.train(r["task"], _DATA[r["task"]], spec, r["workers"], r["lr"], r["seed"], pattern or "auto")
        out["spec"] = r["spec"]  # the report's row: the scheme and the pattern asked for
    except Exception as e:  # recorded, so that the report shows it instead of a missing row
        out = dict(r, error=f"{type(e).__name__}: {e}")
    return out  # saved by the main process (run_all): one writer for the study's file


def run_all(runs: list[dict[str, Any]], jobs: int) -> None:
    from tqdm import tqdm

    todo = [r for r in runs if not store().has(r)]
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="study runs", unit="run", dynamic_ncols=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_one, r): r for r in todo}
        for f in as_completed(futures):
            r, out = futures[f], f.result()
            store().put(r, out)
            msg = out.get("error") or f"{out['test']:.3f}"
            bar.set_postfix_str(f"{r['task']} w{r['workers']} {r['spec']} lr={r['lr']:g} s{r['seed']}: {msg}")
            bar.update(1)
    bar.close()
    print(f"{len(todo)} runs in {time.monotonic() - t0:.0f} s")


def main() -> None:
    global RAW
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default="main", choices=["main", "baselines", "smoke", "second_phase"])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="only write the tables and plots from saved runs")
    ap.add_argument("--raw", default="",
                    help="the file runs are saved in (default results/quality/study_runs/main.jsonl.gz)")
    ap.add_argument("--tag", default="", help="results/quality/quality<TAG>.md and plots (another --raw's report)")
    a = ap.parse_args()
    if a.raw:
        RAW = Path(a.raw).resolve()
    elif a.plan in OWN_FILES:
        RAW = ROOT / "results" / "quality" / "study_runs" / f"{a.plan}.jsonl.gz"
    tag = a.tag or (f"_{a.plan}" if a.plan in OWN_FILES else "")
    runs = plan(a.plan, a.seeds)
    edges = (lambda _: []) if a.plan in AT_BEST_RATE else beyond_edges
    if not a.report:
        run_all(edges(runs) + runs, a.jobs)  # the rows already complete first: they are cheap
        # rows whose best rate is at an edge of the grid: the rates beyond it, until it is inside
        while more := [r for r in edges(runs) if not store().has(r)]:
            run_all(more, a.jobs)
    runs += edges(runs)
    from bench.quality import study_report

    study_report.write(runs, [out for r in runs if (out := store().get(r)) is not None], tag, a.plan, RAW)


if __name__ == "__main__":
    main()
