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

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from numpy.typing import NDArray

from ..api import decode_flat, split
from ..errors import GradqError, RankMismatchError
from ..frontend.workers import wait
from ..reduce import stop as codec
from ..reduce.codec import encode_fed
from ..reduce.core import Allgather, Allreduce, Alltoall, Barrier, Request
from ..reduce.integrity import Phase, verify_payloads
from ..reduce.stats import Clock
from ..spec import SchemeLike
from ..wire import blocks, payload
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


@dataclass
class _Fused:
    """One Horovod alltoall carrying several requests' parts, alltoalls' and allgathers'
    (:meth:`HorovodTransport.start_fused`), waited once, by whichever part is waited first (the
    driver's thread and a worker may both wait: a lock); its results, or the error that wait
    raised, serve every part."""

    handle: Any
    requests: list[Alltoall | Allgather]
    tags: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    results: list[Any] | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class _Part:
    """Request ``index`` of a fused alltoall: what :meth:`HorovodTransport.wait` takes for it."""

    fused: _Fused
    index: int


def _tag(name: str) -> int:
    """A request's tag in a fused alltoall: 64 bits of its name's hash (names are unique in a round)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _raw(buf: Any) -> NDArray[np.uint8]:
    """A request's buffer as bytes (NumPy or a tensor, brought to the host; no copy where it is one)."""
    return blocks.as_bytes(buf if isinstance(buf, np.ndarray) else buf.detach().cpu().contiguous().numpy())


def _as_sent(request: Alltoall | Allgather, data: NDArray[np.uint8]) -> Any:
    """Received bytes as the request's kind of buffer: NumPy of its dtype, or a tensor where it was sent."""
    sent = request.buf
    if isinstance(sent, np.ndarray):
        return data.view(sent.dtype)
    return torch.from_numpy(data.view(torch.empty(0, dtype=sent.dtype).numpy().dtype)).to(sent.device)


class HorovodTransport:
    """The core's collectives on one process set, through Horovod's asynchronous ops."""

    def __init__(self, process_set: Any, clock: Clock | None = None) -> None:
        self.process_set, self.clock = process_set, clock

    def size(self) -> int:
        """The ranks of this transport's process set (the global set's where none is named)."""
        got = self.process_set.size() if self.process_set is not None else None
        return int(got) if got is not None else int(hvd.size())

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

    def start_fused(self, requests: Sequence[Alltoall | Allgather], name: str) -> list[Any]:
        """Several alltoall and allgather requests (the fusable ones of one round, in an order
        every rank shares) as ONE Horovod alltoall named ``name``: what each sends each rank (an
        allgather's whole buffer to every rank) travels as a tagged frame
        (:func:`hvd_gradq.wire.blocks.frames`: its name's tag, its length, its bytes; empty parts
        left out), so each request's result comes back exactly as its own collective's would (an
        allgather's: every rank's buffer in rank order). Returns a handle a request for
        :meth:`wait`. Why one: :class:`~hvd_gradq.reduce.core.Alltoall`, :class:`~hvd_gradq.reduce.core.Allgather`."""
        tags = [_tag(r.name) for r in requests]
        if len(set(tags)) != len(tags):
            raise GradqError(f"{name}: two requests of one round share a name's tag: {[r.name for r in requests]}")
        size = self.size()
        to: list[list[tuple[int, NDArray[np.uint8]]]] = [[] for _ in range(size)]
        for request, tag in zip(requests, tags):
            raw = _raw(request.buf)
            if isinstance(request, Allgather):  # the same bytes to every rank
                for rank in range(size):
                    to[rank].append((tag, raw))
                continue
            if len(request.splits) != size:
                raise GradqError(f"{request.name}: {len(request.splits)} splits in a process set of {size} ranks")
            width = raw.shape[0] // max(1, sum(request.splits))  # bytes an element
            at = 0
            for rank, k in enumerate(request.splits):
                to[rank].append((tag, raw[at:at + k * width]))
                at += k * width
        chunks = [blocks.frames(parts) for parts in to]
        splits = [sum(int(a.shape[0]) for a in c) for c in chunks]
        send = np.concatenate([a for c in chunks for a in c]) if sum(splits) else np.zeros(0, np.uint8)
        handle = hvd.alltoall_async(torch.from_numpy(send), splits=torch.tensor(splits, dtype=torch.int32), name=name,
                                    process_set=self.process_set)
        fused = _Fused(handle, list(requests), tags)
        return [_Part(fused, i) for i in range(len(requests))]

    def _fused(self, part: _Part) -> Any:
        """A fused request's result: the one alltoall waited (once), each sender's frames split by tag."""
        fused = part.fused
        with fused.lock:
            if fused.error is not None:
                raise fused.error
            if fused.results is None:
                try:
                    out, got = sync(fused.handle, self.clock)
                except BaseException as e:  # every part raises the one error
                    fused.error = e
                    raise
                raw, at, frames = out.numpy(), 0, []
                for nbytes in got.tolist():  # what each rank sent this one, in rank order
                    frames.append(blocks.split_frames(raw[at:at + nbytes]))
                    at += nbytes
                known = set(fused.tags)
                if any(set(f) - known for f in frames):
                    raise RankMismatchError(f"{fused.requests[0].name}: a rank sent a part of a tensor this rank does "
                                            "not reduce in this round; the ranks' models or patterns differ")
                fused.results = [_as_sent(r, np.concatenate([f[tag] for f in frames if tag in f] or
                                                            [np.zeros(0, np.uint8)]))
                                 for r, tag in zip(fused.requests, fused.tags)]
        return fused.results[part.index]

    @staticmethod
    def request_of(handle: Any) -> Request:
        """The request a handle of :meth:`start` or :meth:`start_fused` was started for."""
        return handle.fused.requests[handle.index] if isinstance(handle, _Part) else handle[0]

    def wait(self, handle: Any) -> Any:
        if isinstance(handle, _Part):
            return self._fused(handle)
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


def _found(unless: Any) -> bool:
    """Whether a finding of :meth:`TorchCodec.verify` names a corrupted payload."""
    return unless is not None and float(unless.reshape(-1)[0]) != 0.0  # a finding is one element


def _elements(buf: NDArray[np.uint8], own: Any, out: Any) -> int:
    """The element count of a sum whose payloads failed their checks: this rank's own values'
    or the result buffer's where there is one, else the first payload's header where that one is
    intact (every payload a sum takes encodes the same elements)."""
    if own is not None:
        return int(own.shape[0])
    if out is not None:
        return int(out.numel())
    flat = np.ascontiguousarray(np.asarray(buf).reshape(-1))
    # the first payload unreadable too: this rank's part is empty, and the verdict, which every
    # rank reads before applying the step, names the corruption
    return payload.read_header(flat).n if payload.intact(flat) is not None else 0


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

    def encode_fed(self, config: SchemeLike, x: Any, e: Any, scale: float | None, e_out: Any,
                   bounds: Sequence[tuple[int, int]],
                   seeds: Sequence[Seed]) -> tuple[NDArray[np.uint8], tuple[int, ...], list[Any]] | None:
        if self.on_device:  # a device codec: its residual stays on the device, in torch's operations
            return None
        bufs = []
        for (lo, hi), seed in zip(bounds, seeds):
            b = encode_fed(config, x[lo:hi], None if e is None else e[lo:hi], scale, e_out[lo:hi], seed)
            if b is None:
                return None
            bufs.append(b)
        return ((bufs[0] if len(bufs) == 1 else np.concatenate(bufs)), tuple(int(b.shape[0]) for b in bufs),
                [None] * len(bufs))  # no own values: a sum decodes this rank's payload with the others

    def verify(self, buf: NDArray[np.uint8], finder: int, phase: int, ranks: Sequence[int] | None = None,
               whole: bool = True) -> torch.Tensor:
        return torch.from_numpy(verify_payloads(buf, finder, Phase(phase), ranks))

    def sum(self, buf: NDArray[np.uint8], rank: int, own: Any, what: str,
            ranks: Sequence[int] | None = None, unless: Any = None, out: Any = None) -> tuple[torch.Tensor, int]:
        if _found(unless):  # a corrupted payload: zeros in its place (the step's verdict names it)
            n = _elements(buf, own, out)
            where = own.device if isinstance(own, torch.Tensor) else self.device if self.on_device else "cpu"
            return torch.zeros(n, dtype=torch.float32, device=where), 0
        return device.sum_any(buf, rank, own, what, ranks, self.device if self.on_device else None, out)

    def concat(self, buf: NDArray[np.uint8], rank: int, own: Any, sizes: Sequence[int], what: str,
               ranks: Sequence[int] | None = None, unless: Any = None, out: Any = None) -> torch.Tensor:
        if _found(unless):
            return torch.zeros(sum(sizes), dtype=torch.float32, device=self.device)
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
