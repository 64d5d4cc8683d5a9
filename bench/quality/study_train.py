"""One run of the quality study: a workload trained by ``workers`` simulated data-parallel
workers whose gradients are reduced by :class:`sim_reduce.SimReducer` (the library's reduction,
in one process). Returns the run's summary (a JSON-able dict)."""
from __future__ import annotations

import math
import time
from typing import Any

import torch

import hvd_gradq
from bench.quality.sim_reduce import SimReducer
from bench.quality.study_tasks import TASKS, lr_at, make_run

#: the Horovod baselines, which are not hvd_gradq schemes
BASELINES = {"none": None, "fp16": "fp16"}


def reducer_for(spec: str, workers: int, seed: int, pattern: str = "auto") -> SimReducer:
    scheme = BASELINES[spec] if spec in BASELINES else hvd_gradq.parse(spec)
    return SimReducer(scheme, workers, seed=seed, pattern=pattern)


def train(task_name: str, data: dict[str, Any], spec: str, workers: int, lr: float, seed: int,
          pattern: str = "auto") -> dict[str, Any]:
    task = TASKS[task_name]
    torch.set_num_threads(1)
    run = make_run(task, data, workers, lr, seed)
    red = reducer_for(spec, workers, seed, pattern)
    params = [(n, p) for n, p in run.model.named_parameters() if p.requires_grad]
    curve: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    diverged = False
    for step in range(task.steps):
        for g in run.opt.param_groups:
            g["lr"] = lr_at(step, task.steps, lr)
        grads: list[list[torch.Tensor]] = []
        losses = []
        for xb, yb in run.batches(step):
            run.model.zero_grad(set_to_none=True)
            loss = run.loss(run.model, xb, yb)
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([p.grad.detach().clone() for _, p in params])  # type: ignore[union-attr]
        mean_loss = sum(losses) / len(losses)
        if not math.isfinite(mean_loss):
            diverged = True
            break
        if step % 10 == 0 or step == task.steps - 1:
            curve.append((step, mean_loss))
        red.begin_step()
        for i, (name, p) in enumerate(params):
            p.grad = red.reduce(name, [g[i] for g in grads])
        run.opt.step()
    wall = time.perf_counter() - t0
    worst = 0.0 if task.higher_is_better else float("inf")
    dev = worst if diverged else run.evaluate(run.model, "dev")
    test = worst if diverged else run.evaluate(run.model, "test")
    if not math.isfinite(dev) or not math.isfinite(test):
        diverged, dev, test = True, worst, worst
    fp32 = sum(round(2 * (workers - 1) / workers * 4 * p.numel()) for _, p in params) * task.steps
    return {
        "task": task_name, "spec": spec, "workers": workers, "lr": lr, "seed": seed, "pattern": pattern,
        "steps": task.steps, "dev": dev, "test": test, "diverged": diverged, "curve": curve,
        "sent_per_step": sum(red.sent.values()) / task.steps, "fp32_per_step": fp32 / task.steps,
        "patterns": sorted(set(red.patterns.values())), "params": sum(p.numel() for _, p in params),
        "wall_s": wall,
    }
