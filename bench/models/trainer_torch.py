"""PyTorch side of the model benchmark's worker: one model a compression, each through stock
``hvd.DistributedOptimizer``, and the collectives the worker's loop needs (slowest rank's times,
every rank's weight digests). Imported by :mod:`bench.models.models_worker` under Horovod only."""
from __future__ import annotations

import argparse
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import hvd_gradq.torch as gq
from bench.models import catalog, torch_models


def init() -> tuple[int, int]:
    hvd.init()
    return hvd.rank(), hvd.size()


def threads() -> dict[str, Any]:
    """What the rank computes with: torch's intra-op threads (OMP_NUM_THREADS sets them)."""
    return {"torch_threads": torch.get_num_threads()}


class Trainer:
    """One compression's model (the same initial weights for every compression, broadcast from
    rank 0 anyway), SGD with momentum, and this rank's fixed synthetic batch. Collective names
    carry the compression's index, so the models of one launch never share one."""

    def __init__(self, spec: str, index: int, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)
        self.spec = spec
        self.model = torch_models.build(args.model, args.layers).train()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(args.seed * 1000 + hvd.rank())  # each rank its own samples
        self.x, self.y = torch_models.batch(args.model, args.batch, args.image, args.seq, gen)
        named = [(f"m{index}.{n}", p) for n, p in self.model.named_parameters()]
        base = catalog.baseline(spec)
        self.compressor = None if base else gq.from_spec(spec, named_parameters=named)
        comp = getattr(hvd.Compression, base) if base else self.compressor
        sgd = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.opt = hvd.DistributedOptimizer(sgd, named_parameters=named, compression=comp)

    def step(self) -> None:
        self.opt.zero_grad()
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()

    def weights(self) -> list[Any]:
        """The trained weights as NumPy arrays, in the model's order (for the ranks' digest)."""
        return [p.detach().numpy() for p in self.model.parameters()]


def make(spec: str, index: int, args: argparse.Namespace) -> Trainer:
    return Trainer(spec, index, args)


def allreduce_max(values: np.ndarray, name: str) -> np.ndarray:
    return hvd.allreduce(torch.from_numpy(values), op=hvd.Max, name=name).numpy()


def allgather(rows: np.ndarray, name: str) -> np.ndarray:
    return hvd.allgather(torch.from_numpy(rows), name=name).numpy()


def shutdown() -> None:
    hvd.shutdown()
