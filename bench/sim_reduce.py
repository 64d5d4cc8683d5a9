"""N data-parallel workers in one process: the PyTorch frontend's reduction with Horovod's
collectives replaced by in-process sums, for studies that need hundreds of training runs.

Why a simulation is faithful here: every rank of a Horovod job computes the same reduced bits
(the tests check it), and those bits are a pure function of the workers' gradients, the scheme,
the seed and the step. :class:`SimReducer` computes that function with the frontend's own parts:
the pattern and pass-through policy (:func:`hvd_gradq.frontend.patterns.decide`, the warm-up
rule), the payloads (:func:`hvd_gradq.frontend.codec.encode`: the compiled kernels and wire
format), each worker's error feedback (:class:`hvd_gradq.feedback.Memory` with the torch
frontend's store), the shared-scale encoder of the summable pattern and the scatter pattern's
chunks, second (finer) quantization and server-side residual, with the rounding seeds of
:func:`hvd_gradq.frontend.names.words` (worker r draws what rank r would draw). A gathered
payload decodes to what its sender's ``own`` holds (decoding is deterministic), so sums of
``own`` arrays in rank order are the sums each rank forms. What it leaves out is timing and the
summation order inside Horovod's fp32 ring allreduce (tiny tensors, warm-up steps), which
changes the last bits of those sums only.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvd_gradq.feedback import Memory, reduced_key
from hvd_gradq.frontend import codec, names
from hvd_gradq.frontend.patterns import Pattern, chunk_bounds, cost, decide, in_warmup, parse_pattern, reduced_scheme
from hvd_gradq.policy import Policy
from hvd_gradq.schemes.level import EvenLevelScheme
from hvd_gradq.schemes.scheme import Scheme
from hvd_gradq.schemes.summable import decode_codes, encode_shared, local_stats
from hvd_gradq.spec import Config, as_config
from hvd_gradq.torch.feedback import TensorStore
from hvd_gradq.torch.ops import TorchOps

_CPU = TorchOps("cpu")


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
        assert isinstance(self.scheme, Scheme)
        step = self.steps.get(name, 0)
        pattern = decide(self.config or self.scheme, n, len(shape), w, self.pattern)
        if pattern is not Pattern.FP32:
            self.steps[name] = step + 1
            if in_warmup(self.policy, step):
                pattern = Pattern.FP32
        self.patterns[name] = pattern.value
        if pattern is Pattern.FP32:
            return self._plain(name, flat, shape, fp16=False)
        if self.policy.ef:
            flat = [m.compensate(name, x) for m, x in zip(self.memory, flat)]
        run = {Pattern.GATHER: self._gather, Pattern.SUMMABLE: self._summable, Pattern.SCATTER: self._scatter}
        total = run[pattern](name, step, flat)
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
        assert isinstance(self.scheme, Scheme)
        seed = names.words(self.seed, rank, key, step)
        buf, own = codec.encode(scheme or self.scheme, x.numpy(), seed, key)
        return buf, torch.from_numpy(own)

    def _gather(self, name: str, step: int, flat: list[torch.Tensor]) -> torch.Tensor:
        owns = []
        for r, x in enumerate(flat):
            buf, own = self._encode(x, r, step, name)
            if self.policy.ef:
                self.memory[r].update(name, x, own)
            owns.append(own)
            if r == 0:
                self._count("gather", buf.shape[0] * (self.workers - 1))
        total = owns[0].clone()
        for o in owns[1:]:
            total += o
        return total

    def _summable(self, name: str, step: int, flat: list[torch.Tensor]) -> torch.Tensor:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        stats = local_stats(scheme, _CPU, flat[0])
        for x in flat[1:]:
            stats = torch.maximum(stats, local_stats(scheme, _CPU, x))
        n = flat[0].numel()
        summed = None
        meta = None
        for r, x in enumerate(flat):
            seed = names.words(self.seed, r, name, step)
            codes, meta = encode_shared(scheme, _CPU, x, stats, seed)
            if self.policy.ef:
                self.memory[r].update(name, x, decode_codes(scheme, _CPU, codes, meta, n))
            summed = codes.clone() if summed is None else summed + codes
        self._count("summable", cost(scheme, n, 1, self.workers, Pattern.SUMMABLE).sent)
        return decode_codes(scheme, _CPU, summed, meta, n, count=self.workers)

    def _scatter(self, name: str, step: int, flat: list[torch.Tensor]) -> torch.Tensor:
        w, n = self.workers, flat[0].numel()
        bounds = chunk_bounds(n, self.scheme.bucket, w)  # type: ignore[union-attr]
        parts: list[torch.Tensor | None] = [None] * w
        for r, x in enumerate(flat):
            owns = []
            for j, (lo, hi) in enumerate(bounds):
                buf, own = self._encode(x[lo:hi], r, step, f"{name}#{j}")
                owns.append(own)
                parts[j] = own.clone() if parts[j] is None else parts[j] + own  # type: ignore[operator]
                if r == 0 and j != 0:
                    self._count("scatter", buf.shape[0])
            if self.policy.ef:
                self.memory[r].update(name, x, torch.cat(owns))
        key = reduced_key(name)
        reduced = []
        for j, part in enumerate(parts):  # rank j owns chunk j: its second quantization and residual
            assert part is not None
            sent = self.memory[j].compensate(key, part) if self.policy.ef else part
            buf, own = self._encode(sent, j, step, key, reduced_scheme(self.scheme, w))  # type: ignore[arg-type]
            if self.policy.ef:
                self.memory[j].update(key, sent, own)
            if j == 0:
                self._count("scatter", buf.shape[0] * (w - 1))
            reduced.append(own)
        return torch.cat(reduced)
