"""Probe (a tool, not library): two things tried against BinGrad+EF's loss under AdamW in the
quality study's transformer (``results/quality/quality.md``, chars block: +9% test loss vs fp32), one
seed each, in the study's simulator.

* ``bucket=128``: narrower buckets, so that each bucket's two levels follow the magnitudes of
  fewer coordinates (a transformer's rows are 128 wide). +0.5 bit an element of metadata.
* ``ef21``: EF21 (Richtarik, Sokolov, Fatkhullin 2021) instead of classic error feedback:
  worker r keeps an estimate h_r of its gradient and sends C(g_r - h_r), h_r += C(g_r - h_r);
  every rank holds H = mean h_r and hands the optimizer H. Classic EF hands AdamW the quantized
  values themselves (two magnitudes a bucket), which is what inflates Adam's second moment for
  small coordinates; EF21's H is a running estimate whose coordinates keep their own size.
  (Gather pattern only: this probe's own reduction, not the library's.)

    .venv/bin/python bench/quality/probe_adamw.py [--lrs 4e-3,8e-3] > results/quality/probe_adamw.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

import hvd_gradq  # noqa: E402
from bench.quality import study_train  # noqa: E402
from bench.quality.sim_reduce import SimReducer  # noqa: E402
from bench.quality.study_tasks import TASKS, load_data  # noqa: E402
from hvd_gradq.plan.decide import decide  # noqa: E402
from hvd_gradq.plan.pattern import Pattern  # noqa: E402
from hvd_gradq.schemes.scheme import Scheme  # noqa: E402


class EF21(SimReducer):
    """EF21 over the gather pattern: per-worker estimates h_r, the shared estimate H."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.h: list[dict[str, torch.Tensor]] = [{} for _ in range(self.workers)]
        self.H: dict[str, torch.Tensor] = {}

    def reduce(self, name: str, grads: list[torch.Tensor]) -> torch.Tensor:
        shape, n, w = grads[0].shape, grads[0].numel(), self.workers
        flat = [g.detach().reshape(-1).to(torch.float32) for g in grads]
        assert isinstance(self.scheme, Scheme)
        if decide(self.scheme, n, len(shape), w, Pattern.GATHER).pattern is Pattern.FP32:
            return self._plain(name, flat, shape, fp16=False)
        step = self.steps.get(name, 0)
        self.steps[name] = step + 1
        zero = torch.zeros(n)
        total = torch.zeros(n)
        for r, x in enumerate(flat):
            h = self.h[r].get(name, zero)
            buf, own = self._encode(x - h, r, step, name)
            self.h[r][name] = h + own
            total += own
            if r == 0:
                self._count("gather", buf.shape[0] * (w - 1))
        self.H[name] = self.H.get(name, zero) + total / w
        self.patterns[name] = "gather"
        return self.H[name].reshape(shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lrs", default="4e-3,8e-3")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = load_data(TASKS["chars"])
    plain = study_train.reducer_for
    for label, spec, make in [("bucket=128", "bingrad:ef=true,bucket=128", plain),
                              ("ef21", "bingrad:ef=false",
                               lambda s, w, seed, pattern="auto": EF21(hvd_gradq.parse(s), w, seed=seed))]:
        study_train.reducer_for = make
        for lr in (float(v) for v in a.lrs.split(",")):
            out = study_train.train("chars", data, spec, 4, lr, a.seed)
            print(json.dumps({"probe": label, **{k: out[k] for k in ("spec", "lr", "seed", "dev", "test",
                                                                      "sent_per_step")}}), flush=True)
    study_train.reducer_for = plain


if __name__ == "__main__":
    main()
