"""A Horovod ``Compressor`` for ``horovod.torch.DistributedOptimizer`` that is real on the wire.

Horovod sums whatever ``compress()`` returns, with torch's allreduce refusing 8-bit types, and
no tensor name reaches the compressor (NOTES §2). So ``compress()`` starts hvd_gradq's own named
collective on the packed payload (an allgather of uint8 bytes, or a Sum-allreduce of int32 lanes
for the summable pattern) and hands Horovod a one-element tensor of 1.0; after Horovod's
allreduce it reads 1 (op=Average) or N (op=Sum), which tells ``decompress()`` how to scale.
``decompress()`` waits for the collective, decodes every rank's contribution in rank order and
returns the gradient in its own shape and dtype, the same bits on every rank.

Parameter identity: a ``register_post_accumulate_grad_hook`` on each named parameter (it runs
before Horovod's own hook) tags ``p.grad`` with the parameter's name, so ``compress()`` finds it
in O(1) even though torch hands over a new gradient tensor every step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from ..api import dequantize
from ..errors import GradqError, NonFiniteError, RankMismatchError
from ..frontend import codec
from ..frontend.patterns import Pattern, choose, chunk_bounds, cost, fp32_cost, lanes_for, parse_pattern
from ..frontend.stats import Stats
from ..packing import pack_lanes, unpack_lanes
from ..payload import split
from ..schemes.base import EvenLevelScheme, NonFinite, Scheme, decode_codes, encode_shared, local_stats
from .ops import TorchOps

TAG = "_hvd_gradq_name"
_CPU = TorchOps("cpu")


@dataclass
class _Pass:
    dtype: torch.dtype


@dataclass
class _Ctx:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    pattern: Pattern
    handle: Any
    own: Any = None  # this rank's decoded contribution (gather)
    meta: Any = None  # shared meta (summable)
    lanes: Any = None
    step: int = 0
    bounds: Any = None  # chunk ranges (scatter)
    sent: int = 0  # bytes this rank sent for this tensor (known at compress)
    fp32: int = 0
    own_bytes: int = 0


class GradqCompressor:
    """Compress gradients with a hvd_gradq scheme inside ``hvd.DistributedOptimizer``.

    Args:
        scheme: the scheme (``hvd_gradq.parse("orq:levels=5")``).
        named_parameters: ``model.named_parameters()``: names every gradient (required).
        seed: base seed of the rounding noise; draws differ across ranks, steps and tensors.
        pattern: ``auto`` (cost model), ``gather`` or ``summable``.
        check_ranks: at the first step, allgather a digest of the configuration and stop every
            rank with an error naming the ranks and the difference if they disagree.
    """

    def __init__(
        self,
        scheme: Scheme,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        *,
        seed: int = 0,
        pattern: str | Pattern = "auto",
        check_ranks: bool = True,
    ) -> None:
        if named_parameters is None:
            raise GradqError(
                f"{type(self).__name__} needs named_parameters=model.named_parameters(): the names "
                "key error-feedback state and the collectives (Horovod passes no name to a compressor)"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise GradqError(f"seed must be an integer, not {type(seed).__name__}")
        self.scheme = scheme
        self.seed = seed
        self.pattern = parse_pattern(pattern)
        if self.pattern is Pattern.SUMMABLE:
            choose(scheme, 1, 1, 2, Pattern.SUMMABLE)  # refuse now, not at the first step
        self.check_ranks = check_ranks
        self._params: dict[str, torch.nn.Parameter] = {}
        seen: set[int] = set()
        for name, p in named_parameters:
            if not isinstance(name, str) or not isinstance(p, torch.Tensor):
                raise GradqError("named_parameters must yield (name, parameter) pairs, e.g. model.named_parameters()")
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name in self._params:
                raise GradqError(f"parameter name {name!r} appears twice in named_parameters")
            self._params[name] = p
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_tagger(name))  # type: ignore[no-untyped-call]
        self._steps: dict[str, int] = {}
        self._residuals: dict[str, torch.Tensor] = {}
        self._stats = Stats()
        self._checked = False

    # -- identity ------------------------------------------------------------------------------
    def _name_of(self, tensor: torch.Tensor) -> str:
        name = getattr(tensor, TAG, None)
        if isinstance(name, str):
            return name
        # Horovod makes a zero gradient for parameters that got none this step (no hook ran).
        for n, p in self._params.items():
            if p.grad is tensor:
                return n
        raise GradqError(
            "compress() got a tensor that is not the gradient of a parameter in named_parameters; "
            "pass the same model's named_parameters() to the compressor and to DistributedOptimizer"
        )

    def config(self) -> str:
        """What every rank must agree on."""
        return f"{self.scheme.spec}|pattern={self.pattern.value}|seed={self.seed}|v=1"

    def _check_ranks(self) -> None:
        self._checked = True
        if not self.check_ranks or hvd.size() == 1:
            return
        mine = self.config().encode()
        lens = hvd.allgather(torch.tensor([len(mine)], dtype=torch.int64), name="hvd_gradq.config.len")
        allb = hvd.allgather(torch.frombuffer(bytearray(mine), dtype=torch.uint8), name="hvd_gradq.config")
        codec.check_configs(lens.tolist(), allb.numpy())

    # -- Horovod's interface -------------------------------------------------------------------
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if isinstance(tensor, torch.nn.Parameter):
            raise GradqError(
                "hvd_gradq compressors do not support op=hvd.Adasum (it reduces parameter deltas "
                "pairwise, which quantized payloads cannot be); use op=hvd.Average or hvd.Sum"
            )
        if not self._checked:
            self._check_ranks()
        name = self._name_of(tensor)
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        rank, size = hvd.rank(), hvd.size()
        x = tensor.detach().reshape(-1).to(torch.float32)
        if self.scheme.ef:
            e = self._residuals.get(name)
            if e is not None:
                x = x + e.to(x.device)
        n = x.numel()
        pattern = choose(self.scheme, n, tensor.dim(), size, self.pattern)
        if (
            self.pattern is Pattern.AUTO
            and cost(self.scheme, n, tensor.dim(), size, pattern).received >= fp32_cost(n, size).received
        ):
            # Tiny tensors (biases): a payload header costs more than the values. Horovod's own
            # fp32 allreduce takes them, exactly (torch's allreduce has no bf16: sent as fp32).
            self._stats.record(
                name, "fp32", fp32_cost(n, size).sent, fp32_cost(n, size).received, fp32_cost(n, size).sent
            )
            return tensor.to(torch.float32) if tensor.dtype == torch.bfloat16 else tensor, _Pass(tensor.dtype)
        if pattern is Pattern.SUMMABLE and self.scheme.nonfinite is not NonFinite.RAISE:
            pattern = Pattern.GATHER  # skip/propagate change a rank's payload on its own
        seed = codec.draw_seed(self.seed, rank, step, name)
        ctx = _Ctx(name, tensor.shape, tensor.dtype, tensor.device, pattern, None, step=step)
        ctx.fp32 = fp32_cost(n, size).sent
        if pattern is Pattern.SCATTER:
            decoded = self._scatter_start(x, name, step, ctx)
        elif pattern is Pattern.GATHER:
            xs = x.cpu().numpy()
            try:
                buf, own = codec.encode(self.scheme, xs, seed, f"{name} (step {step})")
            except NonFiniteError:
                # Tell the other ranks before stopping, so that they raise too instead of
                # waiting forever for this rank's payload.
                hvd.allgather(torch.from_numpy(codec.poison()), name=f"hvd_gradq.g.{name}")
                raise
            ctx.own = own
            ctx.handle = hvd.allgather_async(torch.from_numpy(buf), name=f"hvd_gradq.g.{name}")
            decoded = own
            ctx.sent = buf.shape[0] * (size - 1)
        else:
            decoded = self._summable_start(x, seed, name, step, ctx)
        if self.scheme.ef:
            self._residuals[name] = x - torch.as_tensor(decoded, device=x.device)
        return torch.ones(1, dtype=torch.float32), ctx

    def _scatter_start(self, x: torch.Tensor, name: str, step: int, ctx: _Ctx) -> Any:
        rank, size = hvd.rank(), hvd.size()
        xs = x.cpu().numpy()
        ctx.bounds = chunk_bounds(xs.shape[0], self.scheme.bucket, size)
        bufs, owns = [], []
        for j, (lo, hi) in enumerate(ctx.bounds):
            seed = codec.draw_seed(self.seed, rank, step, f"{name}#{j}")
            try:
                b, own = codec.encode(self.scheme, xs[lo:hi], seed, f"{name} (step {step})")
            except NonFiniteError:
                b, own = codec.poison(), None
            bufs.append(b)
            owns.append(own)
        lens = torch.tensor([b.shape[0] for b in bufs], dtype=torch.int32)
        ctx.handle = hvd.alltoall_async(torch.from_numpy(np.concatenate(bufs)), splits=lens, name=f"hvd_gradq.a.{name}")
        ctx.own = owns[rank]
        ctx.own_bytes = int(bufs[rank].shape[0])
        if any(o is None for o in owns):
            hvd.synchronize(ctx.handle)  # the others learn of it from the poison payload
            raise NonFiniteError(f"{name} (step {step}): non-finite values (NaN/Inf) in the gradient")
        ctx.sent = sum(b.shape[0] for j, b in enumerate(bufs) if j != rank)
        return np.concatenate([o for o in owns if o is not None])

    def _scatter_finish(self, ctx: _Ctx) -> torch.Tensor:
        rank = hvd.rank()
        recv, _ = hvd.synchronize(ctx.handle)
        part, count = codec.decode_sum(recv.numpy(), rank, ctx.own, ctx.name)
        received = int(recv.numel()) - ctx.own_bytes
        key = f"{ctx.name}#reduce"
        if self.scheme.ef and key in self._residuals:
            part = part + self._residuals[key].numpy()
        seed = codec.draw_seed(self.seed, rank, ctx.step, key)
        buf, own = codec.encode(self.scheme, part, seed, f"{ctx.name} (step {ctx.step}, reduced)")
        if self.scheme.ef:
            self._residuals[key] = torch.from_numpy(part - own)
        gathered = hvd.allgather(torch.from_numpy(buf), name=f"hvd_gradq.r.{ctx.name}").numpy()
        pieces = [own if r == rank else dequantize(p).reshape(-1) for r, p in enumerate(split(gathered))]
        ctx.sent += buf.shape[0] * (hvd.size() - 1)
        received += int(gathered.shape[0]) - buf.shape[0]
        self._stats.record(ctx.name, "scatter", ctx.sent, received, ctx.fp32)
        return torch.from_numpy(np.concatenate(pieces).astype(np.float32, copy=False))

    def _summable_start(self, x: torch.Tensor, seed: int, name: str, step: int, ctx: _Ctx) -> Any:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        size = hvd.size()
        xc = x.cpu()
        finite = bool(torch.isfinite(xc).all())
        stats = (
            local_stats(scheme, _CPU, xc)
            if finite
            else torch.full((-(-x.numel() // scheme.bucket), scheme.meta_width), float("inf"))
        )
        # a rank with NaN/Inf sends +inf statistics: every rank sees it in the max and stops
        stats = hvd.allreduce(stats.contiguous(), op=hvd.Max, name=f"hvd_gradq.s.{name}")
        if not finite:
            raise NonFiniteError(f"{name} (step {step}): non-finite values (NaN/Inf) in the gradient")
        if not bool(torch.isfinite(stats).all()):
            raise NonFiniteError(f"{name} (step {step}): another rank had non-finite values (NaN/Inf) in this gradient")
        codes, meta = encode_shared(scheme, _CPU, xc, stats, seed)
        lay = lanes_for(scheme.symbols, size)
        lanes = pack_lanes(_CPU, codes, lay.field_bits, lay.fields).to(torch.int32)
        ctx.meta = meta
        ctx.lanes = lay
        ctx.handle = hvd.allreduce_async(lanes, op=hvd.Sum, name=f"hvd_gradq.l.{name}")
        c = cost(scheme, x.numel(), 1, size, Pattern.SUMMABLE)
        self._stats.record(name, "summable", c.sent, c.received, fp32_cost(x.numel(), size).sent)
        ctx.sent = -1  # recorded here: the ring allreduce's bytes follow from the lane count
        return decode_codes(scheme, _CPU, codes, meta, x.numel())

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is None:  # sparse gradients bypass compression
            return tensor
        if isinstance(ctx, _Pass):
            return tensor.to(ctx.dtype)
        if not isinstance(ctx, _Ctx):
            raise GradqError("decompress() got a context hvd_gradq did not make")
        size = hvd.size()
        averaged = float(tensor.reshape(-1)[0]) < 1.5
        if ctx.pattern is Pattern.SCATTER:
            out = self._scatter_finish(ctx)
        elif ctx.pattern is Pattern.GATHER:
            gathered = hvd.synchronize(ctx.handle)
            total, count = codec.decode_sum(gathered.numpy(), hvd.rank(), ctx.own, ctx.name)
            if count != size:
                raise RankMismatchError(f"{ctx.name}: gathered {count} payloads from {size} ranks")
            own_len = ctx.sent // max(size - 1, 1)
            self._stats.record(ctx.name, "gather", ctx.sent, int(gathered.numel()) - own_len, ctx.fp32)
            out = torch.from_numpy(total)
        else:
            scheme = self.scheme
            assert isinstance(scheme, EvenLevelScheme)
            summed = hvd.synchronize(ctx.handle)
            n = int(np.prod(ctx.shape)) if len(ctx.shape) else 1
            codes = unpack_lanes(_CPU, summed.to(torch.int64), ctx.lanes.field_bits, ctx.lanes.fields, n)
            out = decode_codes(scheme, _CPU, codes, ctx.meta, n, count=size)
        if averaged:
            out = out / size
        return out.reshape(ctx.shape).to(device=ctx.device, dtype=ctx.dtype)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals and per-tensor step counters (the random streams' positions)."""
        return {
            "config": self.config(),
            "rank": hvd.rank(),
            "size": hvd.size(),
            "steps": dict(self._steps),
            "residuals": {k: v.detach().clone().cpu() for k, v in self._residuals.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not {"config", "steps", "residuals"} <= set(state):
            raise GradqError("load_state_dict expects a dict from GradqCompressor.state_dict()")
        if state["config"] != self.config():
            raise GradqError(f"the checkpoint was made with {state['config']!r}, this compressor is {self.config()!r}")
        here = (hvd.rank(), hvd.size())
        there = (state.get("rank", here[0]), state.get("size", here[1]))
        if there[1] != here[1] and state["residuals"]:
            raise GradqError(
                f"the checkpoint holds error-feedback residuals of {there[1]} ranks; this job has {here[1]}. "
                "Residuals are per rank: resume on the same number of ranks, or drop them with "
                "state['residuals'] = {} (a one-step bias, then EF resumes)"
            )
        if there[0] != here[0] and state["residuals"]:
            raise GradqError(
                f"this is rank {here[0]}, the checkpoint holds rank {there[0]}'s residuals; "
                "save and load one compressor state per rank"
            )
        unknown = sorted({k.split("#")[0] for k in state["residuals"]} - set(self._params))
        if unknown:
            raise GradqError(f"the checkpoint has residuals for unknown parameters: {unknown[:5]}")
        for k, v in state["residuals"].items():
            if "#" in k:  # a scatter chunk's residual: its size follows the chunking
                continue
            n = self._params[k].numel()
            if v.numel() != n:
                raise GradqError(f"residual of {k!r} has {v.numel()} elements; the parameter has {n}")
        self._steps = {str(k): int(v) for k, v in state["steps"].items()}
        self._residuals = {k: v.detach().clone().to(torch.float32) for k, v in state["residuals"].items()}

    def stats(self) -> dict[str, Any]:
        """Bytes this rank sent and received, last step and in total, per pattern, against fp32."""
        return self._stats.summary()

    def digest(self) -> str:
        h = hashlib.sha256(self.config().encode())
        return h.hexdigest()[:16]


def _tagger(name: str) -> Any:
    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            setattr(p.grad, TAG, name)

    return hook
