"""Quality study: what each scheme costs in accuracy and gradient error on MNIST-1D.

Part 1 (training): the MNIST-1D CNN of ``examples/torch_mnist1d.py`` on 4 ranks
(``horovodrun -np 4 --gloo``), every scheme x 3 seeds, final test accuracy (mean and spread)
against the bytes each rank sent -> ``results/quality.md``, ``results/quality_accuracy_vs_bytes.png``.
All runs share one ``horovodrun`` launch (a worker mode of this script calls the example's
``train()`` once per run), because starting Horovod and torch costs more than a short run on a
small machine; each finished run is saved at once under ``results/raw/quality/`` and a
relaunch resumes with the runs that are missing (``--fresh`` starts over).

Part 2 (error): gradients captured from that training (rank 0's local gradients at a few steps
of the uncompressed seed-0 run, ``--dump-grads``) are quantized offline by every scheme:
relative error E||Q(x)-x||^2/||x||^2, split into bias^2 ||E Q(x)-x||^2/||x||^2 and variance, against
bits an element; ORQ's variance against the exact optimum (a dynamic program over data points,
buckets of 128) and BinGrad-b's error against the exact 2-means optimum ->
``results/quality_error.md``, ``results/error_vs_bits.png``.

    .venv/bin/python scripts/quality_study.py                 # both parts (~35 min on 2 busy cores)
    .venv/bin/python scripts/quality_study.py --part error    # part 2 only (needs the dump)
"""
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

ROOT = Path(__file__).resolve().parents[1]
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


# ==================================================================================================
# worker: runs under horovodrun, every rank
# ==================================================================================================
def worker(plan_path: str) -> None:
    import horovod.torch as hvd
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    import common
    import torch_mnist1d

    hvd.init()
    torch.set_num_threads(1)
    plan = json.loads(Path(plan_path).read_text())
    for run in plan["runs"]:
        argv = ["--compression", run["spec"], "--seed", str(run["seed"]), "--quiet"] + plan["common_args"]
        if run.get("dump"):
            argv += ["--dump-grads", run["dump"]]
        args = common.parse_args("quality study run", torch_mnist1d.extra_args, argv)
        t0 = time.perf_counter()
        try:
            summary = torch_mnist1d.train(args)
            summary["run_wall_s"] = time.perf_counter() - t0
        except Exception as e:  # deterministic failures hit every rank alike; record and go on
            summary = {"error": f"{type(e).__name__}: {e}", "compression": run["spec"], "seed": run["seed"]}
        if hvd.rank() == 0:
            out = Path(run["out"])
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, out)


# ==================================================================================================
# part 1: training
# ==================================================================================================
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
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    horovodrun = Path(sys.executable).parent / "horovodrun"
    for attempt in range(2):
        todo = [r for r in runs if not done(r)]
        if not todo:
            break
        plan = raw / "plan.json"
        plan.write_text(json.dumps({"runs": todo, "common_args": common_args, "config": cfg}, indent=1))
        cmd = [str(horovodrun) if horovodrun.exists() else "horovodrun", "-np", str(a.np), "-H",
               f"localhost:{a.np}", "--gloo", sys.executable, str(Path(__file__).resolve()), "--worker", str(plan)]
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


def write_training_report(a: argparse.Namespace, rows: list[dict[str, Any]], out: Path, took: float) -> list[str]:
    base = next((r for r in rows if r["spec"] == "none" and r["n"]), None)
    params = next((r["params"] for r in rows if r["n"]), 0)
    run_s = sum(r.get("run_s", 0.0) for r in rows)
    opt_text = "Adam" if a.optimizer == "adam" else "SGD (momentum 0.9, Nesterov)"
    if a.target_seeds > a.seeds:
        seeds_text = (f"seeds 0..{a.target_seeds - 1} for `none` and the schemes with targets, seed"
                      f"{'s 0..' + str(a.seeds - 1) if a.seeds > 1 else ' 0'} for the others (the column *runs*)")
    else:
        seeds_text = f"seeds 0..{a.seeds - 1}"
    lines = [
        "# Quality study, part 1: MNIST-1D accuracy against bytes sent",
        "",
        f"Generated by `scripts/quality_study.py` ({time.strftime('%Y-%m-%d %H:%M')}). The MNIST-1D CNN of "
        "`examples/torch_mnist1d.py` (3 stride-2 conv layers of 25 channels + linear, "
        f"{params:,} parameters), "
        f"{a.np} ranks (`horovodrun -np {a.np} --gloo`, one machine), {a.batch_size} samples a rank a step "
        f"(global batch {a.np * a.batch_size}), {a.epochs} epochs ({a.epochs * (4000 // a.np // a.batch_size)} "
        f"steps), {opt_text}, peak lr {a.lr} (1 epoch warm-up, cosine to 0), {seeds_text} (a seed fixes the model "
        "init, the data order and the rounding noise). Test accuracy on the 1000 MNIST-1D test signals. "
        f"Time: the runs took {run_s / 60:.1f} min together (set-up, training, evaluation; plus ~1 min of "
        "Horovod and torch start-up per launch)"
        + (f"; this invocation {took / 60:.1f} min." if took > 30 else "."),
        "",
        "Bytes: what rank 0 sent a step, from `compressor.stats()`, against what a ring allreduce of the "
        f"fp32 gradients sends (2(N-1)/N x 4 = {2 * (a.np - 1) / a.np * 4:.1f} bytes an element). Per tensor the "
        "frontend's cost model picks the *summable* pattern (schemes with evenly spaced levels: integer codes "
        "summed by a ring allreduce) or *gather* (every rank's payload allgathered: each rank sends its "
        f"payload to the N-1 = {a.np - 1} others, so a gathered payload of b bits an element costs "
        f"{a.np - 1}b against {2 * (a.np - 1) / a.np * 32:.0f} bits for fp32 at N = {a.np}, half the saving it "
        "has at N = 2). The payload sizes themselves (bits an element) are in part 2. Step time and compress "
        "share (time inside the compressor's compress and decompress, which includes waiting for hvd_gradq's "
        f"own collective) were measured with {a.np} ranks on a shared 2-core machine with other jobs "
        "running: compare them only roughly.",
        "",
        "| scheme | runs | test accuracy % (mean ± sd) | min – max | Δ vs none (points) | bytes sent / step | "
        "x less than fp32 | step ms | compress share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r["n"]:
            lines.append(f"| `{r['spec']}` | 0 | failed: {'; '.join(r['errors'])[:200]} | | | | | | |")
            continue
        delta = f"{r['mean'] - base['mean']:+.2f}" if base and r is not base else "—"
        acc = f"{r['mean']:.2f} ± {r['std']:.2f}" if r["n"] > 1 else f"{r['mean']:.2f} (1 run)"
        lines.append(
            f"| `{r['spec']}` | {r['n']} | {acc} | {r['min']:.1f} – {r['max']:.1f} | "
            f"{delta} | {r['sent_per_step']:,.0f} | {r['ratio']:.2f} | {r['step_ms']:.0f} | {r['share']:.0f}% |"
        )
    verdicts = []
    lines += ["", "## Targets (means over seeds)", ""]
    if base is None:
        lines.append("No uncompressed baseline finished: no verdicts.")
    for spec, tol in TARGETS:
        r = next((x for x in rows if x["spec"] == spec), None)
        if base is None or r is None or not r["n"]:
            verdicts.append(f"{spec}: not measured")
            continue
        d = r["mean"] - base["mean"]
        paired = [r["acc"][i] - base["acc"][base["seeds"].index(s)] for i, s in enumerate(r["seeds"])
                  if s in base["seeds"]]
        sd = f"{np.std(paired, ddof=1):.2f}" if len(paired) > 1 else "—"
        met = d >= -tol
        v = (f"`{spec}` within {tol} point of `none`: **{'met' if met else 'NOT met'}** "
             f"({r['mean']:.2f}% vs {base['mean']:.2f}%, Δ {d:+.2f}; per-seed differences "
             f"{', '.join(f'{p:+.1f}' for p in paired)}, sd {sd}, n = {len(paired)})")
        lines.append("- " + v)
        verdicts.append(v)
    if max(a.seeds, a.target_seeds) > 1:
        lines += ["", "With n seeds a mean difference is known to about ±sd/√n of the per-seed differences; "
                  "a target met or missed by less than that is within seed noise."]
    else:
        lines += ["", "One seed: no spread is known; differences of a few points may be seed noise."]
    if a.optimizer == "adam":
        lines += [
            "", "## Adam and error feedback", "",
            "Every error-feedback scheme trails `none` by more than unbiased schemes whose single-step "
            "error (part 2) is larger, sign +EF down to chance. Error feedback sends small coordinates rarely and in "
            "bursts (the residual builds up, then goes out at once); Adam divides each coordinate by its "
            "running RMS, so those bursts become full-size steps in directions the true gradient barely "
            "moves (a known mismatch: 1-bit Adam, Tang et al. 2021, freezes Adam's variance term for this "
            "reason). The unbiased schemes lose accuracy roughly in the order of their relative variance "
            "(part 2). Whether this is the optimizer or the schemes shows in the same runs under SGD with "
            "momentum, below.",
        ]
        sup = supplement(Path(a.raw).parent / "quality_sgd")
        if sup:
            lines += ["", "### Supplement: the same training with SGD (momentum 0.9, Nesterov)", "",
                      f"`scripts/quality_study.py --optimizer sgd --lr {sup[0]['lr']} --seeds 1 --target-seeds 1 "
                      "--schemes ... --raw results/raw/quality_sgd --tag _sgd` (4 ranks, same data, batch, "
                      "epochs and schedule; peak lr 0.2, the best of 0.2, 0.4 and 0.8 for `none` in a short "
                      "single-process sweep; one seed: read differences of a few points as noise). Full table: "
                      "`quality_sgd.md`.", "",
                      "| scheme | test accuracy % (SGD) | Δ vs none (SGD) | test accuracy % (Adam, above) |",
                      "|---|---:|---:|---:|"]
            ref = next((r for r in sup if r["spec"] == "none"), None)
            adam = {r["spec"]: r for r in rows if r["n"]}
            for r in sup:
                d = f"{r['mean'] - ref['mean']:+.2f}" if ref and r is not ref else "—"
                am = f"{adam[r['spec']]['mean']:.2f}" if r["spec"] in adam else "—"
                lines.append(f"| `{r['spec']}` | {r['mean']:.2f} ({r['n']} run{'s' if r['n'] > 1 else ''}) | {d} "
                             f"| {am} |")
    (out / f"quality{a.tag}.md").write_text("\n".join(lines) + "\n")
    return verdicts


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


# ==================================================================================================
# part 2: error on captured gradients
# ==================================================================================================
def exact_orq_variance(x: np.ndarray, s: int, bucket: int) -> np.ndarray:
    """Per bucket, the minimum over level sets (s levels, l_0 = min, l_{s-1} = max) of the stochastic-
    rounding variance sum (l_{j+1}-x)(x-l_j): the library's exact level search
    (``hvd_gradq.kernels.orq_levels``, checked against an O(s w^2) program in tests/unit/test_orq.py)."""
    from hvd_gradq.kernels.orq_levels import levels

    x = np.asarray(x, np.float32)
    full = len(x) // bucket * bucket
    parts = [x[:full].reshape(-1, bucket)] if full else []
    if full < len(x):
        parts.append(x[full:].reshape(1, -1))
    out = []
    for rows in parts:
        out.append(levels_variance(rows.reshape(-1), levels(rows, s), rows.shape[1]))
    return np.concatenate(out) if out else np.zeros(0)


def levels_variance(x: np.ndarray, table: np.ndarray, bucket: int) -> np.ndarray:
    """Per bucket, sum (hi-x)(x-lo) for stochastic rounding onto the bucket's sorted ``table`` row."""
    out = []
    for b, b0 in enumerate(range(0, len(x), bucket)):
        xb = x[b0 : b0 + bucket].astype(np.float64)
        t = np.sort(table[b].astype(np.float64))
        j = np.clip(np.searchsorted(t, xb, side="right") - 1, 0, len(t) - 2)
        lo, hi = t[j], t[j + 1]
        out.append(float(np.sum(np.clip((hi - xb) * (xb - lo), 0.0, None))))
    return np.array(out)


def exact_two_means_sse(x: np.ndarray, bucket: int) -> np.ndarray:
    """Per bucket, the minimum squared error of any 2-level quantizer (exact 1-D 2-means)."""
    out = []
    for b0 in range(0, len(x), bucket):
        y = np.sort(x[b0 : b0 + bucket].astype(np.float64))
        w = len(y)
        if w < 2:
            out.append(0.0)
            continue
        p = np.cumsum(y)
        k = np.arange(1, w)
        tot = p[-1]
        sse = np.sum(y * y) - p[:-1] ** 2 / k - (tot - p[:-1]) ** 2 / (w - k)
        out.append(max(0.0, float(sse.min())))
    return np.array(out)


def error_part(a: argparse.Namespace, raw: Path, out: Path, train_rows: list[dict[str, Any]] | None) -> None:
    from tqdm import tqdm

    import hvd_gradq

    dump = raw / DUMP_NAME
    if not dump.exists():
        raise SystemExit(f"{dump} is missing: run the training part first (it dumps the gradients)")
    with np.load(dump) as z:
        keys = sorted(z.files)
        grads: dict[str, list[tuple[str, np.ndarray]]] = {}
        for k in keys:
            step, name = k.split("/", 1)
            grads.setdefault(step, []).append((name, z[k].astype(np.float32).reshape(-1)))
    steps = sorted(grads)
    n_elems = sum(g.size for _, g in grads[steps[0]])
    specs = [s.replace(",ef=true", "").replace(":ef=true", "") for s in a.schemes]
    specs = list(dict.fromkeys(specs))
    extra = ["orq:levels=3,bucket=128", "orq:levels=5,bucket=128", "orq:levels=9,bucket=128", "bingrad:bucket=128",
             "bingrad:variant=pb,bucket=128"]
    rows = []
    bar = tqdm(total=len(specs) + len(extra), desc="error analysis", unit="scheme", dynamic_ncols=True)
    for spec in specs + extra:
        scheme = hvd_gradq.parse(spec)
        draws = ERROR_DRAWS if scheme.stochastic else 1
        err = bias2 = norm2 = 0.0
        wire = body = 0
        for step in steps:
            for name, x in grads[step]:
                qs = []
                for d in range(draws):
                    p = hvd_gradq.quantize(x, spec, seed=1000 * d + 17, name=name)
                    if d == 0:
                        wire += p.nbytes
                        body += p.body_nbytes
                    qs.append(hvd_gradq.dequantize(p).astype(np.float64).reshape(-1))
                q = np.stack(qs)
                xd = x.astype(np.float64)
                err += float(np.mean(np.sum((q - xd) ** 2, axis=1)))
                if draws > 1:  # unbiased estimate of ||E Q - x||^2: remove the mean's sampling noise
                    b = float(np.sum((q.mean(0) - xd) ** 2)) - float(np.sum(q.var(0, ddof=1))) / draws
                else:
                    b = float(np.sum((q[0] - xd) ** 2))
                bias2 += b
                norm2 += float(np.sum(xd * xd))
        rows.append({"spec": spec, "unbiased": bool(scheme.unbiased), "stochastic": bool(scheme.stochastic),
                     "bits": 8 * wire / (n_elems * len(steps)), "body_bits": 8 * body / (n_elems * len(steps)),
                     "err": err / norm2, "bias2": max(bias2 / norm2, 0.0), "draws": draws})
        bar.update(1)
    bar.close()

    # optimum comparisons at buckets of 128
    opt_rows = []
    for s in (3, 5, 9):
        spec = f"orq:levels={s},bucket=128"
        v_orq = v_opt = v_even = 0.0
        worst = 1.0
        for step in steps:
            for name, x in grads[step]:
                p = hvd_gradq.quantize(x, spec, seed=1, name=name)
                table = np.asarray(p.parts["meta"], np.float32).reshape(-1, s)
                vo = levels_variance(x, table, 128)
                ve = exact_orq_variance(x, s, 128)
                mins = np.array([x[b : b + 128].min() for b in range(0, len(x), 128)], np.float64)
                maxs = np.array([x[b : b + 128].max() for b in range(0, len(x), 128)], np.float64)
                even = mins[:, None] + (maxs - mins)[:, None] * np.linspace(0, 1, s)[None, :]
                v_orq += vo.sum()
                v_opt += ve.sum()
                v_even += levels_variance(x, even, 128).sum()
                nz = ve > 1e-30
                if nz.any():
                    worst = max(worst, float(np.max(vo[nz] / ve[nz])))
        norm2 = sum(float(np.sum(x.astype(np.float64) ** 2)) for st in steps for _, x in grads[st])
        opt_rows.append({"what": f"ORQ-{s} variance", "scheme": v_orq / norm2, "optimum": v_opt / norm2,
                         "ratio": v_orq / v_opt if v_opt else float("nan"), "worst": worst,
                         "even": v_even / norm2})
    sse_b = sse_opt = 0.0
    worst = 1.0
    for step in steps:
        for name, x in grads[step]:
            q = hvd_gradq.dequantize(hvd_gradq.quantize(x, "bingrad:bucket=128", name=name)).reshape(-1)
            per = np.array([np.sum((q[b : b + 128].astype(np.float64) - x[b : b + 128]) ** 2)
                            for b in range(0, len(x), 128)])
            opt = exact_two_means_sse(x, 128)
            sse_b += per.sum()
            sse_opt += opt.sum()
            nz = opt > 1e-30
            if nz.any():
                worst = max(worst, float(np.max(per[nz] / opt[nz])))
    norm2 = sum(float(np.sum(x.astype(np.float64) ** 2)) for st in steps for _, x in grads[st])
    opt_rows.append({"what": "BinGrad-b squared error", "scheme": sse_b / norm2, "optimum": sse_opt / norm2,
                     "ratio": sse_b / sse_opt if sse_opt else float("nan"), "worst": worst, "even": float("nan")})

    write_error_report(a, rows, opt_rows, steps, n_elems, len(grads[steps[0]]), out, dump)
    plot_error(rows, opt_rows, out / "error_vs_bits.png")


def write_error_report(a: argparse.Namespace, rows: list[dict[str, Any]], opt_rows: list[dict[str, Any]],
                       steps: list[str], n_elems: int, n_tensors: int, out: Path, dump: Path) -> None:
    step_ids = ", ".join(str(int(s[4:])) for s in steps)
    lines = [
        "# Quality study, part 2: quantization error on captured gradients",
        "",
        f"Generated by `scripts/quality_study.py --part error` ({time.strftime('%Y-%m-%d %H:%M')}). Gradients: "
        f"rank 0's local (pre-reduction) gradients of the MNIST-1D CNN ({n_elems:,} elements in {n_tensors} "
        "tensors) at "
        f"steps {step_ids} of the uncompressed seed-0 run of part 1 (`{_rel(dump)}`). Each tensor is "
        f"quantized as Horovod would send it (bucket 512 unless stated); stochastic schemes {ERROR_DRAWS} times "
        "with different seeds. Statistics are summed over tensors and steps and divided by ‖x‖²:",
        "",
        "- **error** E‖Q(x)−x‖² / ‖x‖² (mean over draws),",
        "- **bias²** ‖E Q(x)−x‖² / ‖x‖² (for stochastic schemes the squared distance of the draws' mean from "
        f"x minus its sampling noise, trace of the sample covariance / {ERROR_DRAWS}: unbiased, so it scatters "
        "around 0 for unbiased schemes),",
        "- **variance** = error − bias² (for the unbiased schemes this is the *relative variance*),",
        "- **bits/elem**: the whole wire payload (header with the spec string, per-bucket levels/scales, "
        "packed codes) in bits an element; **body bits** leave the header out. The small tensors (biases "
        "of 25 and 10 elements) make headers a real share here.",
        "",
        "Error feedback (`ef=true` in part 1) changes what is quantized at later steps, not a single "
        "quantization, so the part-1 schemes are analysed without it.",
        "",
        "| scheme | unbiased | bits/elem (wire) | body bits/elem | error | bias² | variance |",
        "|---|:---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['spec']}` | {'yes' if r['unbiased'] else 'no'} | {r['bits']:.2f} | {r['body_bits']:.2f} | "
            f"{r['err']:.4g} | {r['bias2']:.3g} | {max(r['err'] - r['bias2'], 0.0):.4g} |"
        )
    lines += [
        "",
        "## Against the exact optimum (buckets of 128)",
        "",
        "ORQ-s: the variance of stochastic rounding onto ORQ's sent levels (computed exactly from the levels "
        "in the payload, no sampling) against the minimum over all level sets with l_0 = min and "
        "l_(s−1) = max, from an exact O(s·w²) dynamic program over the sorted data points (reimplemented "
        "here; the optimum puts every level on a data point). *Evenly spaced* is the same s levels spread "
        "uniformly between min and max (what QSGD-style level sets give). BinGrad-b: its squared error against "
        "the exact minimum-error 2-level quantizer (exact 1-D 2-means over all splits).",
        "",
        "| quantity (÷ ‖x‖²) | scheme | exact optimum | scheme / optimum (total) | worst bucket ratio | "
        "evenly spaced levels |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in opt_rows:
        even = "—" if not np.isfinite(r["even"]) else f"{r['even']:.4g}"
        lines.append(f"| {r['what']} | {r['scheme']:.4g} | {r['optimum']:.4g} | {r['ratio']:.5f} | "
                     f"{r['worst']:.4f} | {even} |")
    (out / "quality_error.md").write_text("\n".join(lines) + "\n")


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


# ==================================================================================================
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["all", "train", "error"], default="all")
    ap.add_argument("--np", type=int, default=4, help="ranks")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of every scheme")
    ap.add_argument("--target-seeds", type=int, default=3,
                    help="seeds of none and the schemes with targets (ORQ-5, ORQ-3, BinGrad+EF), if more")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--schemes", default=";".join(SCHEMES), help="';'-separated specs")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--raw", default=str(ROOT / "results" / "raw" / "quality"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one horovodrun launch may take")
    ap.add_argument("--tag", default="", help="suffix of the part-1 files: results/quality<TAG>.md, ...")
    ap.add_argument("--fresh", action="store_true", help="ignore runs saved by an earlier study")
    ap.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    a.schemes = [s.strip() for s in a.schemes.split(";") if s.strip()]
    out, raw = Path(a.out), Path(a.raw)
    out.mkdir(parents=True, exist_ok=True)
    rows = None
    if a.part in ("all", "train"):
        t0 = time.monotonic()
        results = train_part(a, raw)
        rows = aggregate(results, a.schemes)
        verdicts = write_training_report(a, rows, out, time.monotonic() - t0)
        plot_training(rows, out / f"quality{a.tag}_accuracy_vs_bytes.png", a.np, a.optimizer)
        print((out / f"quality{a.tag}.md").read_text())
        print("\n".join(verdicts))
    if a.part in ("all", "error"):
        error_part(a, raw, out, rows)
        print((out / "quality_error.md").read_text())


if __name__ == "__main__":
    main()
