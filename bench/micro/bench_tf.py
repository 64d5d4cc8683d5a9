#!/usr/bin/env python3
"""hvd_gradq.tensorflow at 4 ranks: bytes sent against fp32 allreduce, and the share of step time
that compression costs, for every scheme.

    .venv/bin/python bench/micro/bench_tf.py [--np 4] [--controller gloo] [--steps 20] [--out results/micro/tf_bench.md]

Launches itself under ``horovodrun``. Each rank trains an MLP (``--width``, 3 dense layers) with
``hvd.DistributedGradientTape`` inside a ``tf.function``, once with ``hvd.Compression.none`` and
once per scheme, and reports from rank 0:

* *bytes sent / step*: what this rank sends for one reduction, from the compressor's ``stats()``
  (a gathered payload goes to N-1 ranks; the summable pattern's ring allreduce sends
  2(N-1)/N of its lanes), and the fp32 ring allreduce's 2(N-1)/N x 4 bytes an element;
* *step ms*: the median wall time of ``--steps`` steps after 3 warm-up steps (rank maximum);
* *overhead*: (step - step with Compression.none) / step: the share of the step spent in
  compress + decompress (less the communication saved; on one machine that is small);
* *pattern*: what ``pattern=auto`` chose per tensor (``fp32``: handed to Horovod's allreduce
  unchanged, where compressed traffic would not be smaller: at 4 ranks a gathered fp16 payload
  is not smaller than a ring allreduce of fp32); the ``(gather)`` rows force the pattern;
* *CPU ms / step*: this rank's process CPU time per step, less sensitive to a shared machine.

The trace (first step) is reported apart: the schemes' graphs are built then.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCHEMES = [
    ("Compression.none (Horovod)", None),
    ("none (hvd_gradq, auto)", "none"),
    ("none (hvd_gradq, gather)", "none|gather"),
    ("fp16 (auto)", "fp16"),
    ("fp16 (gather)", "fp16|gather"),
    ("uniform-8", "uniform:bits=8"),
    ("QSGD-4", "qsgd:levels=4"),
    ("QSGD-4 summable", "qsgd:levels=4|summable"),
    ("TernGrad", "terngrad"),
    ("sign + EF", "sign:ef=true"),
    ("top-k 1% + EF", "topk:ratio=0.01,ef=true"),
    ("BinGrad-b", "bingrad"),
    ("ORQ-3", "orq:levels=3"),
    ("ORQ-5", "orq:levels=5"),
]


def worker(args: argparse.Namespace) -> None:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    import hvd_gradq.tensorflow as gq

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.standard_normal((args.batch, args.width)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, args.batch))
    rows = []
    for label, spec in SCHEMES:
        if args.only and label not in args.only.split(";"):
            continue
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((args.width,)),
                                     tf.keras.layers.Dense(args.width, activation="relu"),
                                     tf.keras.layers.Dense(args.width, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        opt = tf.keras.optimizers.SGD(0.01)
        if spec is None:
            comp = hvd.Compression.none
        else:
            s, _, pattern = spec.partition("|")
            comp = gq.from_spec(s, pattern=pattern or "auto")
        @tf.function
        def step(x, y, model=model, opt=opt, comp=comp):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, model(x, training=True), from_logits=True))
            tape = hvd.DistributedGradientTape(tape, compression=comp)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        t0 = time.perf_counter()
        c0 = time.process_time()
        step(x, y).numpy()
        first = time.perf_counter() - t0
        first_cpu = time.process_time() - c0
        for _ in range(2):
            step(x, y).numpy()
        times, cpus = [], []
        for _ in range(args.steps):
            hvd.allreduce(tf.zeros(1), name=f"bench.barrier.{label}.{len(times)}").numpy()
            t0, c0 = time.perf_counter(), time.process_time()
            step(x, y).numpy()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        med = float(np.median(times))
        med = float(hvd.allreduce(tf.constant(med), op=hvd.Max, name=f"bench.max.{label}").numpy())
        n = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        fp32 = sum(round(2 * (size - 1) / size * 4 * int(np.prod(v.shape))) for v in model.trainable_variables)
        row = {"label": label, "spec": comp.scheme.spec if spec else "horovod none", "params": n,
               "step_ms": 1e3 * med, "cpu_ms": 1e3 * float(np.median(cpus)), "first_s": first,
               "first_cpu_s": first_cpu, "fp32": fp32}
        if spec is None:
            row["sent"] = fp32
        else:
            last = comp.stats()["last_step"]
            row["sent"] = last["all"]["sent"]
            row["patterns"] = sorted(k for k in last if k != "all")
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0 and args.json:
        Path(args.json).write_text(json.dumps({"size": size, "rows": rows, "args": vars(args)}))


def table(data: dict) -> str:
    rows = data["rows"]
    base = next((r for r in rows if r["spec"] == "horovod none"), None)
    a = data["args"]
    out = [
        f"# hvd_gradq.tensorflow: bytes and step time at {data['size']} ranks",
        "",
        f"Generated by `bench/micro/bench_tf.py --np {data['size']} --controller {a['controller']} "
        f"--steps {a['steps']} --width {a['width']} --batch {a['batch']}`: an MLP of {rows[0]['params']:,} parameters "
        f"(3 dense layers), `hvd.DistributedGradientTape` in a `tf.function`, all ranks on one 2-core machine "
        f"(load average {os.getloadavg()[0]:.1f} when written). *sent/step*: bytes this rank sends for one "
        "reduction (the compressor's `stats()`); *fp32*: a ring allreduce's 2(N-1)/N x 4 bytes an element. "
        "*overhead* = (step - step with `Compression.none`) / step: the share of the step spent in compress + "
        "decompress, net of the communication saved. *first step*: tracing and graph optimization.",
        "",
        "| scheme | pattern | sent/step bytes | fp32 bytes | ratio vs fp32 | step ms | overhead | CPU ms/step |"
        " first step s (CPU s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        over = "-" if base is None or r is base else f"{100 * (r['step_ms'] - base['step_ms']) / r['step_ms']:.0f}%"
        pats = ", ".join(r.get("patterns", ["ring allreduce"]))
        out.append(f"| {r['label']} | {pats} | {r['sent']:,} | {r['fp32']:,} | {r['fp32'] / max(r['sent'], 1):.2f} | "
                   f"{r['step_ms']:.1f} | {over} | {r['cpu_ms']:.1f} | {r['first_s']:.1f} ({r['first_cpu_s']:.1f}) |")
    out += ["", "Specs: " + "; ".join(f"{r['label']} = `{r['spec']}`" for r in rows)]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--controller", choices=["gloo", "mpi"], default="gloo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--only", default="", help="labels to run, separated by ';'")
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "bench.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2",
                   OMP_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        hr = Path(sys.executable).parent / "horovodrun"
        cmd = [str(hr) if hr.exists() else "horovodrun", f"--{args.controller}", "-np", str(args.np),
               "-H", f"localhost:{args.np}", sys.executable, str(Path(__file__).resolve()), "--worker", "--json", js,
               "--steps", str(args.steps), "--width", str(args.width), "--batch", str(args.batch),
               "--controller", args.controller]
        if args.only:
            cmd += ["--only", args.only]
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
        text = table(json.loads(Path(js).read_text()))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
