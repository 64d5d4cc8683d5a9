"""Horovod 0.28.1's own TensorFlow optimizer-level tests, with hvd_gradq compressors substituted.

Runs under ``horovodrun -np 2``. For every scheme in ``COMPAT_SCHEMES`` (default: all of
``SCHEMES``), the Horovod entry points the tests call (``horovod.tensorflow``'s
``DistributedGradientTape`` and ``DistributedOptimizer``, which ``PartialDistributedGradientTape``
and the legacy/Keras paths go through, and ``horovod.tensorflow.keras.DistributedOptimizer``, which
``PartialDistributedOptimizer`` goes through) are wrapped so that a call that leaves
``compression`` at its default gets a fresh hvd_gradq compressor for that scheme; then each test
of the unmodified ``horovod_tests/test_tensorflow2_keras.py`` and ``test_tensorflow.py`` in
``TESTS`` runs through unittest. Every rank reports ``{scheme: {test: "ok" | failure text,
test#compressors: count}}``; the scheme ``stock`` runs them unchanged.

``test_tensorflow.py`` imports ``base_test_tensorflow`` (a helper module of Horovod's test tree
that is not in ``horovod_tests/``): :func:`_base_module` provides the eager-mode helpers those
tests use (``evaluate``, ``assign``, ``random_uniform``, ``filter_supported_types``).
"""
from __future__ import annotations

import os
import sys
import traceback
import types
import unittest
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "horovod_tests"))

import horovod.keras as hvd_keras
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import tensorflow as tf
from harness import report

import hvd_gradq.tensorflow as gq


def _base_module() -> types.ModuleType:
    """A ``base_test_tensorflow`` for eager TF 2: the helpers test_tensorflow.py calls (written
    here; ``evaluate`` of an eager no-op Operation returns None, where TF 2.15's test helper
    would raise)."""
    mod = types.ModuleType("base_test_tensorflow")

    class BaseTensorFlowTests(tf.test.TestCase):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tfe = tf

        def evaluate(self, tensors: Any) -> Any:
            if isinstance(tensors, tf.Operation):  # an eager no-op (global_variables_initializer): done
                return None
            return self._eval_helper(tensors)

        def assign(self, variables: Any, values: Any) -> None:
            for var, val in zip(variables, values):
                var.assign(val)

        def random_uniform(self, *args: Any, **kwargs: Any) -> Any:
            tf.random.set_seed(1234)
            return tf.random.uniform(*args, **kwargs)

        def filter_supported_types(self, types_: Any) -> Any:
            return types_

    mod.BaseTensorFlowTests = BaseTensorFlowTests  # type: ignore[attr-defined]
    mod.ccl_supported_types = set()  # type: ignore[attr-defined]
    mod.__all__ = ["BaseTensorFlowTests", "ccl_supported_types"]  # type: ignore[attr-defined]
    return mod


sys.modules.setdefault("base_test_tensorflow", _base_module())

from test_tensorflow import TensorFlowTests  # noqa: E402
from test_tensorflow2_keras import Tf2KerasTests  # noqa: E402

SCHEMES = os.environ.get("COMPAT_SCHEMES", "").split() or [
    "stock", "none", "fp16", "uniform", "qsgd", "terngrad", "sign:ef=true", "topk:ratio=0.05,ef=true",
    "bingrad:ef=true", "orq:levels=3", "orq:levels=5",
]
# every test of the two files that builds a DistributedGradientTape / DistributedOptimizer
KERAS = ["test_train_model_lr_schedule", "test_sparse_as_dense", "test_legacy_optimizer",
         "test_sparse_as_dense_with_grad_aggregation", "test_grad_aggregation_with_inf_grad", "test_from_config",
         "test_gradient_aggregation", "test_gradient_aggregation_with_local_vars",
         "test_partial_distributed_optimizer"]
TENSORFLOW = ["test_local_gradient_aggregation", "test_local_gradient_aggregation_sparse",
              "test_partial_distributed_gradient_tape", "test_model_parallel_model"]
# Lossless substitutes where a test asserts exact values that any lossy scheme changes (the
# test's comment says why); "none" and "fp16" are lossless on these tests' small integers.
LOSSLESS_ONLY: dict[str, str] = {}


def _cases() -> list[tuple[Any, str]]:
    loader = unittest.TestLoader()
    out = []
    for cls, wanted in ((Tf2KerasTests, KERAS), (TensorFlowTests, TENSORFLOW)):
        names = loader.getTestCaseNames(cls)
        for w in wanted:
            out += [(cls, n) for n in names if n == w or (n.startswith(w + "_") and n[len(w) + 1 :][:1].isdigit())]
    return out


_stock = {"tf_tape": hvd.DistributedGradientTape, "tf_opt": hvd.DistributedOptimizer,
          "keras_opt": hvdk.DistributedOptimizer, "partial_opt": hvd_keras.PartialDistributedOptimizer}
_made: list[Any] = []


_by_context: dict[Any, Any] = {}  # per test: one compressor per outermost graph (eager, or a TF1 graph)


def _compressor(spec: str) -> Any:
    """The test's compressor for ``spec``, built once, as a user builds it outside the training
    function (Horovod's tests build the tape inside a ``tf.function``, once per trace)."""
    with tf.init_scope():
        eager = tf.executing_eagerly()
        where = (eager, None if eager else id(tf.compat.v1.get_default_graph()))
        comp = _by_context.get(where)
        if comp is None:
            comp = _by_context[where] = gq.from_spec(spec, seed=7)
            _made.append(comp)
    return comp


def _wrap(original: Any, spec: str, pos: int) -> Any:
    """``original`` with its ``compression`` (keyword, or positional index ``pos``) defaulting to
    the test's hvd_gradq compressor for ``spec``."""
    def make(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("compression", args[pos] if len(args) > pos else hvd.Compression.none)
        if given is hvd.Compression.none and spec != "stock":
            comp = _compressor(spec)
            if len(args) > pos:
                args = args[:pos] + (comp,) + args[pos + 1 :]
            else:
                kwargs["compression"] = comp
        return original(*args, **kwargs)

    return make


def _install(spec: str) -> None:
    # positions of ``compression`` in Horovod 0.28.1's signatures
    hvd.DistributedGradientTape = _wrap(_stock["tf_tape"], spec, 3)
    hvd.DistributedOptimizer = _wrap(_stock["tf_opt"], spec, 5)
    hvdk.DistributedOptimizer = _wrap(_stock["keras_opt"], spec, 4)
    # horovod.keras.PartialDistributedOptimizer builds its optimizer itself, not through the above
    hvd_keras.PartialDistributedOptimizer = _wrap(_stock["partial_opt"], spec, 4)


def run_one(cls: Any, test: str) -> str:
    result = unittest.TestResult()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls(test).run(result)
    problems = result.errors + result.failures
    if problems:
        text = problems[0][1]
        last = text.strip().splitlines()[-1]
        if last.startswith("Skipped:"):  # pytest.skip() inside a unittest run: a skip, not a failure
            return f"skipped: {last[9:]}"
        return text[-3000:]
    if result.skipped:
        return f"skipped: {result.skipped[0][1]}"
    return "ok"


hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
out: dict[str, Any] = {}
only = set(filter(None, os.environ.get("COMPAT_TESTS", "").split()))
for spec in SCHEMES:
    _install(spec)
    out[spec] = {}
    for cls, test in _cases():
        if only and not any(test.startswith(o) for o in only):
            continue
        if spec not in ("stock", "none", "fp16") and any(test.startswith(t) for t in LOSSLESS_ONLY):
            continue
        _made.clear()
        _by_context.clear()
        print(f"[compat] {spec} {test}", flush=True)
        try:
            out[spec][test] = run_one(cls, test)
        except Exception:
            out[spec][test] = traceback.format_exc()[-3000:]
        out[spec][test + "#compressors"] = len(_made)
        hvd.allreduce(tf.constant(0.0), name=f"compat.barrier.{spec}.{test}")  # ranks in step
for name, f in (("DistributedGradientTape", _stock["tf_tape"]), ("DistributedOptimizer", _stock["tf_opt"])):
    setattr(hvd, name, f)
hvdk.DistributedOptimizer = _stock["keras_opt"]
hvd_keras.PartialDistributedOptimizer = _stock["partial_opt"]
report(hvd.rank(), out)
