#!/usr/bin/env python3
"""One rank of the model benchmark (``bench_models.py`` launches it on 2 ranks): every compression
of the list trains its own copy of the model in the SAME launch, in interleaved rounds, so that
drift in the machine's load hits all of them alike.

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python bench/models/models_worker.py \\
        --framework torch --model resnet18 --compressions "fp32;fp16;orq;bingrad" --result /tmp/r.json

Order: build every compression's model (equal weights, broadcast from rank 0), ``--warmup``
untimed steps each (tracing, kernel compiling, Horovod's first negotiation), then ``--rounds``
rounds of ``--steps`` timed steps for each compression in turn. A block's time is the slowest
rank's (one allreduce of every block at the end, so no extra collective runs between blocks).
At the end every rank's weights are hashed and gathered: per compression the ranks must be
bitwise equal. Rank 0 prints each compression's throughput and ratio to Horovod fp16, and writes
the raw result (``--result``) that ``bench_models.py`` tabulates."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench.models import catalog  # noqa: E402
from bench.models.models_report import summary_line, throughput  # noqa: E402

PROGRESS = "MODELS_PROGRESS"  # rank 0's lines the launcher may show


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["torch", "tf"], default="torch")
    ap.add_argument("--model", choices=sorted(catalog.MODELS), default="resnet18")
    ap.add_argument("--compressions", default=catalog.RUN["compressions"],
                    help="fp32 / fp16 (Horovod's own) or hvd_gradq specs, ';'- or ','-separated")
    ap.add_argument("--batch", type=int, default=0, help="samples a rank a step (0: the model's default)")
    ap.add_argument("--image", type=int, default=catalog.RUN["image"], help="CNN input, square")
    ap.add_argument("--seq", type=int, default=catalog.RUN["seq"], help="BERT tokens a sample")
    ap.add_argument("--layers", type=int, default=catalog.RUN["layers"], help="BERT encoder layers")
    ap.add_argument("--steps", type=int, default=catalog.RUN["steps"], help="timed steps a compression a round")
    ap.add_argument("--warmup", type=int, default=catalog.RUN["warmup"], help="untimed steps a compression, first")
    ap.add_argument("--rounds", type=int, default=catalog.RUN["rounds"])
    ap.add_argument("--seed", type=int, default=catalog.RUN["seed"])
    ap.add_argument("--lr", type=float, default=catalog.RUN["lr"])
    ap.add_argument("--result", default="", help="rank 0 writes the raw result here (JSON)")
    args = ap.parse_args(argv)
    args.compressions = catalog.parse_compressions(args.compressions)
    args.batch = args.batch or catalog.MODELS[args.model].batch
    if min(args.steps, args.rounds, args.batch) < 1 or args.warmup < 0:
        ap.error("--steps, --rounds and --batch must be >= 1, --warmup >= 0")
    return args


def digest(arrays: list[Any]) -> bytes:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def ranks_equal(fw: Any, trainers: list[Any]) -> list[bool]:
    """Per trainer: did every rank end with bitwise the same weights? (Each rank's SHA-256, as 4
    int64 a trainer, gathered: Horovod's torch collectives take no uint8.)"""
    rows = np.frombuffer(b"".join(digest(t.weights()) for t in trainers), np.int64).reshape(len(trainers), 4)
    every = fw.allgather(rows.copy(), "models.digests").reshape(-1, len(trainers), 4)
    return [bool((every[:, i] == every[0, i]).all()) for i in range(len(trainers))]


def compressor_s(tr: Any) -> float:
    """Seconds hvd_gradq's compressor has spent inside compress()/decompress() so far (0 for Horovod's own)."""
    return float(tr.compressor.stats()["time"]["total"].get("compressor_s", 0.0)) if tr.compressor is not None else 0.0


#: Steps at most that a compressor measuring its plans (pattern=auto) may take to finish its
#: first trial before the timed rounds (hvd_gradq.plan.trial: a few tens of steps).
TRIAL_STEPS = 120


def settle_trial(tr: Any) -> int:
    """Run ``tr`` until its first trial of auto's plans is over (its ranks agree, so every rank
    leaves the loop at the same step), so that the timed rounds time the plan it took and not
    the trial: what the trial costs is reported on its own (``auto``). Returns the steps run."""
    trial = getattr(tr.compressor, "trial", None)
    steps = 0
    while trial is not None and trial.phase.value != "chosen" and steps < TRIAL_STEPS:
        tr.step()
        steps += 1
    return steps


def auto_of(tr: Any) -> dict[str, Any] | None:
    """What a compressor's measured choice took and why (``stats()['auto']``), or None."""
    if tr.compressor is None:
        return None
    report: dict[str, Any] = tr.compressor.stats().get("auto", {})
    return report if report.get("plan") else None


def link_of(tr: Any) -> str | None:
    """The link rate a compressor's cost model priced with and where it came from
    (``stats()['world']``: ``measured: ...``, ``given`` or ``default``), or None."""
    if tr.compressor is None:
        return None
    world = tr.compressor.stats().get("world", {})
    return f"{world['link_gbps']:.3g} Gbit/s, {world['link']}" if "link" in world else None


def run(fw: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark on this rank (``fw``: :mod:`trainer_torch` or :mod:`trainer_tf`); the raw result."""
    rank, size = fw.init()
    info = catalog.MODELS[args.model]
    t0 = time.perf_counter()
    trainers = [fw.make(spec, i, args) for i, spec in enumerate(args.compressions)]
    trial_steps = {}
    for tr in trainers:
        for _ in range(args.warmup):
            tr.step()
        trial_steps[tr.spec] = settle_trial(tr)
    setup_s = time.perf_counter() - t0
    before = [compressor_s(tr) for tr in trainers]
    blocks = np.zeros((args.rounds, len(trainers)))
    for r in range(args.rounds):
        for i, tr in enumerate(trainers):
            t = time.perf_counter()
            for _ in range(args.steps):
                tr.step()
            blocks[r, i] = time.perf_counter() - t
        if rank == 0:
            print(f"{PROGRESS} round {r + 1}/{args.rounds} done", flush=True)
    slowest = fw.allreduce_max(blocks.ravel().copy(), "models.times").reshape(blocks.shape)
    # seconds a timed step inside compress()/decompress(), the rank with the most
    spent = np.array([compressor_s(tr) - b for tr, b in zip(trainers, before)]) / (args.rounds * args.steps)
    spent = fw.allreduce_max(spent, "models.compressor")
    equal = ranks_equal(fw, trainers)
    params, tensors = (sum(int(w.size) for w in trainers[0].weights()), len(trainers[0].weights()))
    result: dict[str, Any] = {
        "framework": args.framework, "model": args.model, "size": size, "batch": args.batch,
        "image": args.image, "seq": args.seq, "layers": args.layers, "steps": args.steps,
        "warmup": args.warmup, "rounds": args.rounds, "unit": info.unit, "params": params, "tensors": tensors,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "threads": fw.threads(), "setup_s": setup_s,
        "compressions": {
            tr.spec: {"block_s": slowest[:, i].tolist(), "ranks_equal": equal[i],
                      "bytes_vs_fp32": (float(tr.compressor.stats()["total"]["all"]["ratio_vs_fp32"])
                                        if tr.compressor is not None else None),
                      "compressor_s_a_step": float(spent[i]) if tr.compressor is not None else None,
                      "auto": auto_of(tr), "trial_steps": trial_steps[tr.spec], "link": link_of(tr)}
            for i, tr in enumerate(trainers)
        },
    }
    if rank == 0:
        for spec, row in throughput(result).items():
            print(summary_line(spec, row, info.unit), flush=True)
        if args.result:
            Path(args.result).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.framework == "torch":
        from bench.models import trainer_torch as fw
    else:
        from bench.models import trainer_tf as fw  # type: ignore[no-redef]
    run(fw, args)
    fw.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
