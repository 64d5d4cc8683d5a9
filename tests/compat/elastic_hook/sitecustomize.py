"""Substitutes an hvd_gradq compressor into Horovod's own elastic test mains, unmodified.

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``; ``test_compat_elastic.py`` puts
this folder there for the vendored suite's run, and the elastic driver starts every worker with
that environment. When ``COMPAT_ELASTIC_SPEC`` is set (and is not ``stock``), a finder waits for
``horovod.torch`` to be imported and wraps its ``DistributedOptimizer``: a call that leaves
``compression`` at Horovod's default gets ``hvd_gradq.torch.from_spec(spec, pattern=...)``
(``COMPAT_ELASTIC_PATTERN``, e.g. ``gather``: the mains' models are a few elements, which
``pattern=auto`` would rightly send uncompressed). Nothing else in the mains changes; their
``TorchState(model, optimizer, ...)`` carries the compressor through every reset.

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


class _After(importlib.abc.MetaPathFinder):
    """Runs ``_wrap_torch`` right after ``horovod.torch`` has been executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "horovod.torch":
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
            _wrap_torch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _record() -> None:
    try:
        import torch

        h = hashlib.sha256()
        for p in _params:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        c = _made[-1] if _made else None
        w = c._elastic.generation.world if c is not None else None  # Horovod is shut down by now
        rec = {
            "logfile": sys.argv[sys.argv.index("--logfile") + 1] if "--logfile" in sys.argv else "",
            "rank": w.rank if w is not None else -1, "size": w.size if w is not None else -1,
            "compressors": len(_made),
            "generation": c._elastic.generation.number if c is not None else -1,
            "compressed_tensors": sum(v > 0 for v in c._steps.values()) if c is not None else 0,
            "steps": sum(c._steps.values()) if c is not None else 0,
            "params": h.hexdigest(), "torch": torch.__version__,
        }
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
            json.dump(rec, f)
    except Exception as e:  # never change the worker's exit status
        print(f"[compat elastic hook] no record: {e!r}", file=sys.stderr)


if SPEC:
    sys.meta_path.insert(0, _After())
    if OUT:
        atexit.register(_record)
