"""Part 1 of the quality study, running the grid: every scheme x seed trained in one ``horovodrun``
launch (:func:`worker` on every rank), resumed from the runs already saved, then aggregated."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from quality_config import BENCH, DUMP_NAME, ROOT, SCHEMES, TARGETS, run_name


def worker(plan_path: str) -> None:
    import horovod.torch as hvd
    import measure
    import torch
    import train_mnist1d

    hvd.init()
    torch.set_num_threads(1)
    plan = json.loads(Path(plan_path).read_text())
    for run in plan["runs"]:
        argv = ["--compression", run["spec"], "--seed", str(run["seed"]), "--quiet"] + plan["common_args"]
        if run.get("dump"):
            argv += ["--dump-grads", run["dump"]]
        args = measure.parse_args("quality study run", train_mnist1d.extra_args, argv)
        t0 = time.perf_counter()
        try:
            summary = train_mnist1d.train(args)
            summary["run_wall_s"] = time.perf_counter() - t0
        except Exception as e:  # deterministic failures hit every rank alike; record and go on
            summary = {"error": f"{type(e).__name__}: {e}", "compression": run["spec"], "seed": run["seed"]}
        if hvd.rank() == 0:
            out = Path(run["out"])
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, out)



def train_part(a: argparse.Namespace, raw: Path) -> dict[tuple[str, int], dict[str, Any]]:
    from tqdm import tqdm

    raw.mkdir(parents=True, exist_ok=True)
    if a.fresh:
        for f in raw.glob("*__seed*.json"):
            f.unlink()
    common_args = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
                   "--optimizer", a.optimizer]
    runs = []
    key = {spec for spec, _ in TARGETS} | {"none"}
    for seed in range(max(a.seeds, a.target_seeds)):  # seed-major: an interrupted study has whole seeds
        for spec in a.schemes:
            if seed >= (max(a.seeds, a.target_seeds) if spec in key else a.seeds):
                continue
            r = {"spec": spec, "seed": seed, "out": str(raw / f"{run_name(spec, seed)}.json")}
            if spec == "none" and seed == 0:
                r["dump"] = str(raw / DUMP_NAME)
            runs.append(r)
    cfg = {"epochs": a.epochs, "batch_size": a.batch_size, "lr": a.lr, "np": a.np}

    def done(r: dict[str, Any]) -> bool:
        p = Path(r["out"])
        if not p.exists():
            return False
        s = json.loads(p.read_text())
        s.setdefault("optimizer", "adam")  # runs saved before --optimizer existed
        return "error" in s or all(s.get(k) == v for k, v in
                                   (("epochs", a.epochs), ("batch_size_per_rank", a.batch_size), ("lr", a.lr),
                                    ("ranks", a.np), ("optimizer", a.optimizer)))

    bar = tqdm(total=len(runs), desc="quality runs", unit="run", dynamic_ncols=True)
    bar.update(sum(done(r) for r in runs))
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH), env.get("PYTHONPATH", "")])})
    horovodrun = Path(sys.executable).parent / "horovodrun"
    for attempt in range(2):
        todo = [r for r in runs if not done(r)]
        if not todo:
            break
        plan = raw / "plan.json"
        plan.write_text(json.dumps({"runs": todo, "common_args": common_args, "config": cfg}, indent=1))
        cmd = [str(horovodrun) if horovodrun.exists() else "horovodrun", "-np", str(a.np), "-H",
               f"localhost:{a.np}", "--gloo", sys.executable, str(BENCH / "quality_study.py"), "--worker", str(plan)]
        log = open(raw / f"launch{attempt}.log", "w")
        bar.write(f"launch {attempt}: {len(todo)} runs on {a.np} ranks (log: {log.name})")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        signal.signal(signal.SIGTERM, lambda *_, p=proc: (stop(p), sys.exit(143)))
        seen = {r["out"] for r in runs if done(r)}
        t0 = time.monotonic()
        try:
            while proc.poll() is None:
                time.sleep(2)
                for r in todo:
                    if r["out"] not in seen and Path(r["out"]).exists():
                        seen.add(r["out"])
                        s = json.loads(Path(r["out"]).read_text())
                        msg = s.get("error") or f"{100 * s['test_accuracy']:.1f}%"
                        bar.set_postfix_str(f"{r['spec']} s{r['seed']}: {msg}")
                        bar.update(1)
                if time.monotonic() - t0 > a.timeout:
                    bar.write(f"launch {attempt} passed --timeout {a.timeout:.0f} s and is stopped")
                    stop(proc)
                    break
        except KeyboardInterrupt:
            stop(proc)
            raise
        proc.wait()
        log.close()
        if proc.returncode != 0:
            bar.write(f"launch {attempt} exited with {proc.returncode}; see {log.name}")
    bar.close()
    results = {}
    for r in runs:
        if done(r):
            results[(r["spec"], r["seed"])] = json.loads(Path(r["out"]).read_text())
    return results


def supplement(raw: Path) -> list[dict[str, Any]]:
    """Aggregated rows of another study's saved runs (e.g. the SGD supplement), in SCHEMES order."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for f in sorted(raw.glob("*__seed*.json")) if raw.is_dir() else []:
        d = json.loads(f.read_text())
        if "error" not in d:
            found[(d["compression"], d["seed"])] = d
    specs = [x for x in SCHEMES if any(k[0] == x for k in found)]
    specs += sorted({k[0] for k in found} - set(specs))
    rows = [r for r in aggregate(found, specs) if r["n"]]
    for r in rows:
        r["lr"] = next(v["lr"] for k, v in found.items() if k[0] == r["spec"])
    return rows


def stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM horovodrun (it stops the ranks it started), SIGKILL its group if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def aggregate(results: dict[tuple[str, int], dict[str, Any]], schemes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for spec in schemes:
        ok = [results[k] for k in sorted(results) if k[0] == spec and "error" not in results[k]]
        errs = [results[k]["error"] for k in sorted(results) if k[0] == spec and "error" in results[k]]
        if not ok:
            rows.append({"spec": spec, "n": 0, "errors": errs})
            continue
        acc = np.array([100 * s["test_accuracy"] for s in ok])
        rows.append({
            "spec": spec, "n": len(ok), "errors": errs, "acc": acc, "mean": float(acc.mean()),
            "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0, "min": float(acc.min()), "max": float(acc.max()),
            "seeds": [s["seed"] for s in ok], "params": ok[0]["params"],
            "sent_per_step": float(np.mean([s["bytes_sent"] / s["steps"] for s in ok])),
            "fp32_per_step": float(np.mean([s["bytes_fp32"] / s["steps"] for s in ok])),
            "ratio": float(np.mean([s["ratio_vs_fp32"] for s in ok])),
            "step_ms": float(np.mean([1000 * s["step_time_s"] for s in ok])),
            "share": float(np.mean([100 * s["compress_share"] for s in ok])),
            "run_s": float(sum(s.get("run_wall_s", s["wall_s"]) for s in ok)),
        })
    return rows


