"""What the reduction core (:mod:`hvd_gradq.reduce`) asks of PyTorch: Horovod's asynchronous
collectives (:class:`HorovodTransport`) and payloads of torch tensors (:class:`TorchCodec`).

:class:`HorovodTransport` starts each request with ``hvd.allgather_async`` / ``alltoall_async``
/ ``allreduce_async`` on the tensor's process set and waits by polls (:func:`sync`). Payload
bytes come and go as NumPy; tensors leave through the host (Horovod's CPU ops) and come back
where they were; integer values (the summable pattern's lanes, laid out to fit) travel as
int32 and come back as int64.

:class:`TorchCodec` encodes on the gradient's device or on the host (:mod:`.device`); a
payload's ``own`` values stay where they were decoded, and :meth:`TorchCodec.values` brings
them to the tensor's device, as error feedback and the concatenations need.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from numpy.typing import NDArray

from ..api import decode_flat, split
from ..frontend.workers import wait
from ..reduce import stop as codec
from ..reduce.core import Allgather, Allreduce, Alltoall, Barrier, Request
from ..reduce.stats import Clock
from ..spec import SchemeLike
from ..xp import Seed
from . import device


def sync(handle: Any, clock: Clock | None = None) -> Any:
    """``hvd.synchronize(handle)``, waiting by polls: Horovod's own wait holds the GIL, which
    would stall the worker threads for as long as the network takes. The wait counts as
    ``wait`` on ``clock`` (stats)."""
    t0 = time.perf_counter()
    wait(lambda: bool(hvd.poll(handle)))
    out = hvd.synchronize(handle)
    if clock is not None:
        clock.add("wait", time.perf_counter() - t0)
    return out


def _tensor(buf: Any) -> torch.Tensor:
    return torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf.detach().cpu().contiguous()


class HorovodTransport:
    """The core's collectives on one process set, through Horovod's asynchronous ops."""

    def __init__(self, process_set: Any, clock: Clock | None = None) -> None:
        self.process_set, self.clock = process_set, clock

    def start(self, request: Request) -> Any:
        ps, name = self.process_set, request.name
        if isinstance(request, Barrier):  # passed even where Horovod has ended (core.Barrier)
            try:
                return request, hvd.allreduce_async(torch.zeros(1), op=hvd.Sum, name=name, process_set=ps)
            except RuntimeError:
                return request, None
        if isinstance(request, Allgather):
            handle = hvd.allgather_async(_tensor(request.buf), name=name, process_set=ps)
        elif isinstance(request, Alltoall):
            handle = hvd.alltoall_async(_tensor(request.buf), splits=torch.tensor(request.splits, dtype=torch.int32),
                                        name=name, process_set=ps)
        else:
            value = _tensor(request.value)
            if not value.is_floating_point():
                value = value.to(torch.int32)
            handle = hvd.allreduce_async(value, op=hvd.Max if request.op == "max" else hvd.Sum, name=name,
                                         process_set=ps)
        return request, handle

    def wait(self, handle: Any) -> Any:
        request, h = handle
        if isinstance(request, Barrier):
            try:
                if h is not None:
                    sync(h, self.clock)
            except RuntimeError:  # a member past the barrier ended Horovod: this rank raises its own error next
                pass
            return None
        out = sync(h, self.clock)
        if isinstance(request, Alltoall):
            out = out[0]
        sent = request.value if isinstance(request, Allreduce) else request.buf
        if isinstance(sent, np.ndarray):
            return out.numpy()
        if not out.is_floating_point():
            out = out.to(torch.int64)
        return out.to(sent.device)


class TorchCodec:
    """Payloads of flat float32 tensors: on their device when ``on_device`` (:mod:`.device`),
    else by the host kernels; ``own`` values are brought to ``device`` by :meth:`values`.

    ``own``: whether :meth:`encode` keeps this rank's decoded values (error feedback subtracts
    them); without them a sum or concatenation decodes this rank's payload as any other's (the
    same bits), so no full-size array waits from the encode to the decode. ``out``: a flat
    float32 tensor the whole tensor's result may be written into (the gradient's own storage,
    where Horovod's call sets the gradient to the result), else None: a fresh one."""

    def __init__(self, on_device: bool, where: torch.device | str = "cpu", own: bool = True) -> None:
        self.on_device, self.device, self.own = on_device, torch.device(where), own

    def encode(self, config: SchemeLike, x: Any, seed: Seed, what: str) -> tuple[NDArray[np.uint8], Any]:
        return device.encode_any(config, x, seed, what, self.on_device, self.own)

    def encode_chunks(self, config: SchemeLike, x: Any, bounds: Sequence[tuple[int, int]], seeds: Sequence[Seed],
                      what: str) -> tuple[NDArray[np.uint8], tuple[int, ...], list[Any]]:
        made = [self.encode(config, x[lo:hi], seed, what) for (lo, hi), seed in zip(bounds, seeds)]
        return np.concatenate([b for b, _ in made]), tuple(int(b.shape[0]) for b, _ in made), [o for _, o in made]

    def sum(self, buf: NDArray[np.uint8], rank: int, own: Any, what: str,
            ranks: Sequence[int] | None = None, out: Any = None) -> tuple[torch.Tensor, int]:
        return device.sum_any(buf, rank, own, what, ranks, self.device if self.on_device else None, out)

    def concat(self, buf: NDArray[np.uint8], rank: int, own: Any, sizes: Sequence[int], what: str,
               ranks: Sequence[int] | None = None, out: Any = None) -> torch.Tensor:
        peers = codec.stops_in(buf, ranks) if ranks is not None else None
        if peers:
            raise codec.stopped(what, peers)
        # decoded where own lives, as the sum: a tensor's device; NumPy's host; none, the codec's
        where = own.device if isinstance(own, torch.Tensor) else self.device if own is None and self.on_device else None
        total = torch.empty(sum(sizes), dtype=torch.float32, device=self.device) if out is None else out
        at = 0
        for r, p in enumerate(split(buf)):  # each payload decoded into its slice: no full-size temporary
            piece = total[at:at + p.n]
            if r == rank and own is not None:
                piece.copy_(self.values(own))
            elif where is not None:
                piece.copy_(device.decode_on(p, where))
            elif piece.device.type == "cpu":
                decode_flat(p, out=piece.numpy())
            else:
                piece.copy_(torch.from_numpy(decode_flat(p)))
            at += p.n
        return total

    def values(self, own: Any) -> torch.Tensor:
        t = own if isinstance(own, torch.Tensor) else torch.from_numpy(own)
        return t.to(self.device)
