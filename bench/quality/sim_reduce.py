"""N data-parallel workers in one process: the library's reduction core (:mod:`hvd_gradq.reduce`)
on a loopback transport, for studies that need hundreds of training runs.

Every rank of a Horovod job computes the same reduced bits (the tests check it), a pure function
of the workers' gradients, the scheme, the seed and the step. :class:`SimReducer` computes that
function by running the very patterns the PyTorch frontend drives, one generator a simulated
worker (:func:`hvd_gradq.reduce.lockstep`): the pattern and warm-up rule
(:func:`hvd_gradq.plan.decide.decide`), the payloads (PyTorch's codec: the compiled
kernels and wire format), each worker's error feedback (:class:`hvd_gradq.feedback.Memory` with
the torch frontend's store) and rounding seeds (worker r draws what rank r would draw). What it
leaves out is timing and the summation order inside Horovod's fp32 ring allreduce (tiny tensors,
warm-up steps), which changes the last bits of those sums only.

One shortcut, exact by construction: a gathered buffer decodes to the same sum on every rank
(decoding is deterministic and sums run in rank order), so it is decoded once, not once a worker.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hvd_gradq import reduce as core
from hvd_gradq.feedback import Memory
from hvd_gradq.plan.decide import decide
from hvd_gradq.plan.pattern import Pattern, in_warmup, parse_pattern
from hvd_gradq.policy import Policy
from hvd_gradq.reduce.names import words
from hvd_gradq.reduce.stats import Stats
from hvd_gradq.schemes.scheme import Scheme
from hvd_gradq.spec import Config, as_config
from hvd_gradq.torch.ops import TorchOps
from hvd_gradq.torch.store import TensorStore
from hvd_gradq.torch.transport import TorchCodec

_CPU = TorchOps("cpu")


class _SharedSums(TorchCodec):
    """PyTorch's host codec, decoding each gathered buffer once for all workers (see above)."""

    def __init__(self) -> None:
        super().__init__(False)
        self.sums: dict[int, tuple[Any, tuple[torch.Tensor, int]]] = {}

    def sum(self, buf: Any, rank: int, own: Any, what: str, ranks: Any = None,
            unless: Any = None, out: Any = None) -> tuple[torch.Tensor, int]:
        hit = self.sums.get(id(buf))
        if hit is None or hit[0] is not buf:  # (the simulator's parts carry no out: one sum serves all)
            hit = self.sums[id(buf)] = (buf, super().sum(buf, rank, own, what, ranks, unless))
        return hit[1]


class SimReducer:
    """Average of ``workers`` gradients per tensor, as ``hvd.DistributedOptimizer(compression=
    GradqCompressor(scheme, seed=seed, pattern=pattern))`` would reduce them; ``scheme=None`` is
    Horovod's plain fp32 allreduce and ``"fp16"`` Horovod's own ``Compression.fp16``."""

    def __init__(self, scheme: Config | Scheme | str | None, workers: int, seed: int = 0,
                 pattern: str = "auto") -> None:
        # a scheme (or config) with its policy, or one of the two Horovod baselines (no policy)
        self.config = as_config(scheme) if isinstance(scheme, (Config, Scheme)) else None
        self.scheme: Scheme | str | None = self.config.scheme if self.config is not None else scheme
        self.policy = self.config.policy if self.config is not None else Policy()
        self.workers = workers
        self.seed = seed
        self.pattern = parse_pattern(pattern)
        self.memory = [Memory(_CPU, TensorStore(), variant=self.policy.feedback) for _ in range(workers)]
        self.stats = [Stats() for _ in range(workers)]
        self.steps: dict[str, int] = {}
        self.sent: dict[str, int] = {}  # bytes worker 0 sent for each pattern, summed over steps
        self.patterns: dict[str, str] = {}  # tensor name -> the pattern of its latest step

    def begin_step(self) -> None:
        for m in self.memory:
            m.begin_step(None)

    def reduce(self, name: str, grads: list[torch.Tensor]) -> torch.Tensor:
        """The averaged gradient of tensor ``name`` (one float32 tensor a worker, same shape)."""
        shape, n, w = grads[0].shape, grads[0].numel(), self.workers
        flat = [g.detach().reshape(-1).to(torch.float32) for g in grads]
        if self.scheme is None or self.scheme == "fp16":
            return self._plain(name, flat, shape)
        assert isinstance(self.scheme, Scheme) and self.config is not None
        step = self.steps.get(name, 0)
        choice = decide(self.config, n, len(shape), w, self.pattern)
        pattern = choice.pattern
        if pattern is not Pattern.FP32:
            self.steps[name] = step + 1
            if in_warmup(self.policy, step):
                pattern = Pattern.FP32
        self.patterns[name] = pattern.value
        if pattern is Pattern.FP32:
            return self._plain(name, flat, shape, fp16=False)
        if self.policy.ef:
            flat = [m.compensate(name, x) for m, x in zip(self.memory, flat)]
        codec = _SharedSums()
        gens = []
        for r, x in enumerate(flat):
            red = core.Reduction(self.config, self.seed, r, self.memory[r], self.stats[r], _CPU)
            self.stats[r].decide(name, pattern.value, "", n, w)
            gens.append(core.phases(choice, red, core.Part(name, step, core.Group(r, w), codec), x, _CPU))
        total = core.lockstep(_CPU, gens)[0]
        self._count(pattern.value, self.stats[0].tensors[name].sent)
        return (total / w).reshape(shape)

    def _count(self, pattern: str, nbytes: int) -> None:
        self.sent[pattern] = self.sent.get(pattern, 0) + int(nbytes)

    def _plain(self, name: str, flat: list[torch.Tensor], shape: torch.Size, fp16: bool | None = None) -> torch.Tensor:
        half = self.scheme == "fp16" if fp16 is None else fp16
        w, n = self.workers, flat[0].numel()
        xs = [x.to(torch.float16) for x in flat] if half else flat
        total = xs[0].clone()
        for x in xs[1:]:
            total += x
        self._count("fp16" if half else "fp32", round(2 * (w - 1) / w * n * (2 if half else 4)))
        self.patterns.setdefault(name, "fp16" if half else "fp32")
        return (total.to(torch.float32) / w).reshape(shape)

    def _encode(self, x: torch.Tensor, rank: int, step: int, key: str,
                scheme: Scheme | None = None) -> tuple[np.ndarray, torch.Tensor]:
        """One payload of worker ``rank`` and its decoded values (for variants built on the sim)."""
        assert self.config is not None
        buf, own = TorchCodec(False).encode(scheme or self.config, x, words(self.seed, rank, key, step), key)
        return buf, torch.from_numpy(own)
