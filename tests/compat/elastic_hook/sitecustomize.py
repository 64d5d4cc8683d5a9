"""Substitutes an hvd_gradq compressor into Horovod's own elastic test mains, unmodified.

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``; ``test_compat_elastic.py`` puts
this folder there for the vendored suite's run, and the elastic driver starts every worker with
that environment. When ``COMPAT_ELASTIC_SPEC`` is set (and is not ``stock``), a finder waits for
``horovod.torch`` (``horovod.tensorflow``, ``horovod.tensorflow.keras``) to be imported and wraps
its ``DistributedOptimizer`` (``DistributedGradientTape``): a call that leaves ``compression`` at
Horovod's default gets ``hvd_gradq.torch.from_spec(spec, pattern=...)`` (the TensorFlow one)
(``COMPAT_ELASTIC_PATTERN``, e.g. ``gather``: the mains' models are a few elements, which
``pattern=auto`` would rightly send uncompressed). Nothing else in the mains changes; their
``TorchState(model, optimizer, ...)`` (``TensorFlowKerasState``, ``KerasState``) carries the
compressor through every reset.

At exit each worker writes one JSON line to ``COMPAT_ELASTIC_OUT/<pid>.json``: its log file (one
per launch of the suite), final rank, size, the compressor's generation, how many gradients it
compressed, and a SHA-256 of its model's parameters, so the suite can check that the substitution
happened and that the ranks of a launch ended bitwise equal.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from typing import Any

SPEC = os.environ.get("COMPAT_ELASTIC_SPEC", "")
OUT = os.environ.get("COMPAT_ELASTIC_OUT", "")
_made: list[Any] = []
_PID = os.getpid()
_params: list[Any] = []


def _wrap_torch(module: Any) -> None:
    stock = module.DistributedOptimizer

    def make(optimizer: Any, named_parameters: Any = None, compression: Any = module.Compression.none,
             **kwargs: Any) -> Any:
        if compression is module.Compression.none and SPEC != "stock":
            import hvd_gradq.torch as gq

            named_parameters = list(named_parameters) if named_parameters is not None else None
            compression = gq.from_spec(SPEC, named_parameters=named_parameters, seed=7,
                                       pattern=os.environ.get("COMPAT_ELASTIC_PATTERN", "auto"))
            _made.append(compression)
        for group in optimizer.param_groups:
            _params.extend(group["params"])
        return stock(optimizer, named_parameters=named_parameters, compression=compression, **kwargs)

    module.DistributedOptimizer = make


def _tf_compressor(module: Any) -> Any:
    import hvd_gradq.tensorflow as gq

    c = gq.from_spec(SPEC, seed=7, pattern=os.environ.get("COMPAT_ELASTIC_PATTERN", "auto"))
    _made.append(c)
    return c


def _wrap_tf(module: Any) -> None:
    """``DistributedGradientTape`` (the TF2 main) gets the compressor where Horovod's default is left."""
    stock = module.DistributedGradientTape

    def make(gradtape: Any, *args: Any, compression: Any = module.Compression.none, **kwargs: Any) -> Any:
        if compression is module.Compression.none and SPEC != "stock":
            if not _made:
                _tf_compressor(module)
            compression = _made[-1]
        return stock(gradtape, *args, compression=compression, **kwargs)

    module.DistributedGradientTape = make


def _wrap_keras(module: Any) -> None:
    """``horovod.tensorflow.keras.DistributedOptimizer`` (the Keras main), likewise."""
    stock = module.DistributedOptimizer

    def make(optimizer: Any, *args: Any, compression: Any = module.Compression.none, **kwargs: Any) -> Any:
        if compression is module.Compression.none and SPEC != "stock":
            compression = _tf_compressor(module)
        return stock(optimizer, *args, compression=compression, **kwargs)

    module.DistributedOptimizer = make


_WRAPS = {"horovod.torch": lambda m: _wrap_torch(m), "horovod.tensorflow": lambda m: _wrap_tf(m),
          "horovod.tensorflow.keras": lambda m: _wrap_keras(m)}


class _After(importlib.abc.MetaPathFinder):
    """Wraps Horovod's optimizer (or tape) right after ``horovod.torch`` / ``horovod.tensorflow``
    / ``horovod.tensorflow.keras`` has been executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _WRAPS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _WRAPS[name](module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _record() -> None:
    if os.getpid() != _PID or not any(m in sys.modules for m in _WRAPS):  # a forked child, or no Horovod
        return
    try:
        h = hashlib.sha256()
        c = _made[-1] if _made else None
        if "torch" in sys.modules and "tensorflow" not in sys.modules:
            for p in _params:
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
            steps = dict(c._steps) if c is not None else {}
        else:  # TensorFlow: the compressor's step counters; the mains' model is a module global
            main = sys.modules.get("__main__")
            model = getattr(main, "model", None)
            for w in (model.get_weights() if model is not None else []):
                h.update(w.tobytes())
            steps = {k: int(v.numpy()) for k, v in c.steps.items()} if c is not None else {}
        w = c._elastic.generation.world if c is not None else None  # Horovod is shut down by now
        rec = {
            "logfile": sys.argv[sys.argv.index("--logfile") + 1] if "--logfile" in sys.argv else "",
            "rank": w.rank if w is not None else -1, "size": w.size if w is not None else -1,
            "compressors": len(_made),
            "generation": c._elastic.generation.number if c is not None else -1,
            "compressed_tensors": sum(v > 0 for v in steps.values()),
            "steps": sum(steps.values()), "params": h.hexdigest(),
            # auto measuring its plans: the steps its trial has counted since the last reset
            "trial_steps": (c.trial.step + 1) if getattr(c, "trial", None) is not None else 0,
        }
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump(rec, f)
    except Exception as e:  # never change the worker's exit status
        print(f"[compat elastic hook] no record: {e!r}", file=sys.stderr)


if SPEC:
    sys.meta_path.insert(0, _After())
    if OUT:
        atexit.register(_record)
if os.environ.get("HVDQ_DEBUG_HANG"):  # every thread's stack, once, if a worker outlives it
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ["HVDQ_DEBUG_HANG"]), exit=False)
