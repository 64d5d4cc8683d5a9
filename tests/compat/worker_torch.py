"""Horovod 0.28.1's own optimizer-level PyTorch tests, with hvd_gradq compressors substituted.

Runs under ``horovodrun -np 2``. For every scheme in ``SCHEMES``, ``hvd.DistributedOptimizer`` is
wrapped so that a call that leaves ``compression`` at its default gets a fresh hvd_gradq
compressor for that scheme (Horovod's tests never name a compression for the optimizer), then each
test in ``TESTS`` of the unmodified ``horovod_tests/test_torch.py`` runs through unittest. Every
rank reports ``{scheme: {test: "ok" | failure text}}``; the scheme ``stock`` runs them unchanged.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import unittest
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "horovod_tests"))

import horovod.torch as hvd
import torch
from harness import report
from test_torch import TorchTests

import hvd_gradq.torch as gq

# torch 2.13's Muon refuses 1-D parameters whatever the compression, and the tests loop over every
# torch.optim.Optimizer subclass whose module starts with "torch.optim" (NOTES §9): keep it out.
if hasattr(torch.optim, "Muon"):
    torch.optim.Muon.__module__ = "excluded_from_horovod_tests"

SCHEMES = os.environ.get("COMPAT_SCHEMES", "").split() or [
    "none", "fp16", "uniform:bits=8", "qsgd:levels=4", "terngrad", "sign:ef=true",
    "topk:ratio=0.05,ef=true", "bingrad:ef=true", "orq:levels=3", "orq:levels=5,ef=true",
]
# Every test of test_torch.py that builds a DistributedOptimizer, except test_delta_optimizer
# (op=hvd.Adasum, which hvd_gradq refuses by design: tests/parallel/test_torch_compat.py checks
# the refusal) and test_model_parallelism (it needs two GPUs a rank and skips here).
TESTS = [
    "test_broadcast_state", "test_broadcast_state_options", "test_broadcast_state_no_grad",
    "test_force_allreduce", "test_duplicate_names", "test_dynamic_requires_grad",
    "test_gradient_clipping", "test_synchronize_step_warning", "test_no_named_parameters",
    "test_missing_named_parameters", "test_optimizer_no_named_parameters", "test_sparse_embeddings",
    "test_optimizer_process_sets",
]

# TorchTests.tearDown shuts Horovod down after every test and the next test's hvd.init() starts
# it again. Re-initialising Gloo ~150 times in one process races under load ("connect ...:
# Connection refused", seen here with stock compression too), so between tests the ranks only
# meet at a barrier: Horovod stays up for the whole launch.
TorchTests.tearDown = lambda self: hvd.barrier()

_stock = hvd.DistributedOptimizer
_made: list[Any] = []


def _with(spec: str) -> Any:
    def make(optimizer: Any, named_parameters: Any = None, compression: Any = hvd.Compression.none,
             **kwargs: Any) -> Any:
        if compression is hvd.Compression.none and spec != "stock":
            compression = gq.from_spec(spec, seed=7)
            _made.append(compression)
        return _stock(optimizer, named_parameters=named_parameters, compression=compression, **kwargs)

    return make


def run_one(test: str) -> str:
    result = unittest.TestResult()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TorchTests(test).run(result)
    problems = result.errors + result.failures
    if problems:
        return problems[0][1][-3000:]
    if result.skipped:
        return f"skipped: {result.skipped[0][1]}"
    return "ok"


hvd.init()
torch.set_num_threads(1)
out: dict[str, Any] = {spec: {} for spec in SCHEMES}
# test_optimizer_process_sets reduces on rank 0 alone, which advances Horovod's per-process
# handle counter on that rank only; the auto-generated names of later unnamed ops
# ("broadcast.noname.<handle>") then differ between ranks and never match. So it runs last,
# for every scheme (its own unnamed ops run on one-rank sets, where names need not match).
order = [(spec, test) for spec in SCHEMES for test in TESTS if test != "test_optimizer_process_sets"]
order += [(spec, "test_optimizer_process_sets") for spec in SCHEMES]
for spec, test in order:
    hvd.DistributedOptimizer = _with(spec)
    _made.clear()
    print(f"[compat] {spec} {test}", flush=True)
    t0 = time.monotonic()
    try:
        out[spec][test] = run_one(test)
    except Exception:  # report, never stop the other tests
        out[spec][test] = traceback.format_exc()[-3000:]
    # the substitution really happened: the test built at least one hvd_gradq compressor
    out[spec][test + "#compressors"] = len(_made)
    out[spec][test + "#seconds"] = round(time.monotonic() - t0, 1)
hvd.DistributedOptimizer = _stock
report(hvd.rank(), out)
