"""One rank of :mod:`bench_e2e`: the schemes it compares, the model, and the training that each
scheme runs between two phase marks (``bench_e2e.py --worker`` runs this on every emulated host)."""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from bench import measure, netemu

TOKEN = "E2E_RESULT"
#: Bytes of Ethernet (14) + IPv4 (20) + TCP with timestamps (32) headers on every packet: the
#: TCP payload that crossed a link is its byte count minus this per packet (ACKs carry none).
HEADER_BYTES = 66
DONE = "E2E_DONE"
HIDDEN = 2304
DDP_PORT = 29517


@dataclass(frozen=True)
class Entry:
    label: str
    spec: str  # an hvd_gradq spec, or stock-none / stock-fp16 (Horovod), ddp-none / ddp-fp16 / ddp-powersgd
    bits: float  # nominal bits an element on the wire, for the "at or below 4 bits" target

    @property
    def kind(self) -> str:
        if self.spec.startswith("stock-"):
            return "horovod"
        if self.spec.startswith("ddp-"):
            return "ddp"
        return "gradq"


ENTRIES = [
    Entry("none (Horovod fp32)", "stock-none", 32),
    Entry("Horovod fp16", "stock-fp16", 16),
    Entry("DDP fp32", "ddp-none", 32),
    Entry("DDP fp16_compress_hook", "ddp-fp16", 16),
    Entry("DDP powerSGD_hook r4", "ddp-powersgd", 0),
    Entry("ORQ-3", "orq:levels=3", 1.6),
    Entry("ORQ-5", "orq:levels=5", 2.33),
    Entry("ORQ-9", "orq:levels=9", 3.2),
    Entry("BinGrad+EF", "bingrad:ef=true", 1),
    Entry("QSGD (4 levels)", "qsgd", 3),
    Entry("TernGrad", "terngrad", 1.6),
    Entry("sign+EF", "sign:ef=true", 1),
    Entry("Top-K 1% +EF", "topk:ratio=0.01,ef=true", 0.5),
]
TTA_DEFAULT = ("none (Horovod fp32)", "Horovod fp16", "DDP fp16_compress_hook", "DDP powerSGD_hook r4", "ORQ-3",
               "ORQ-5", "BinGrad+EF")


# ============================================================================== worker (one rank)


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(40, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10),
    )


class _Trainer:
    """One scheme's model, optimizer and communication, with a ``step`` and an ``accuracy``."""

    def __init__(self, entry: Entry, index: int, seed: int, lr: float, data: dict[str, Any]) -> None:
        import horovod.torch as hvd
        import torch

        import hvd_gradq.torch as gq

        self.entry, self.data, self.comp = entry, data, None
        self.rank, self.size = hvd.rank(), hvd.size()
        self.model = _model(seed)
        opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.gen = torch.Generator().manual_seed(seed * 1000 + self.rank)
        if entry.kind == "ddp":
            import torch.distributed as dist
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
            from torch.nn.parallel import DistributedDataParallel as DDP

            if not dist.is_initialized():
                os.environ.setdefault("GLOO_SOCKET_IFNAME", netemu.HOST_IFACE)
                dist.init_process_group("gloo", init_method=f"tcp://{netemu.host_addr(0)}:{DDP_PORT}",
                                        rank=self.rank, world_size=self.size)
            # PowerSGD's hook issues its second allreduce from a future's callback thread; with
            # several buckets, ranks can issue them in different orders and Gloo aborts
            # ("Received data size doesn't match expected size"). One bucket keeps the order.
            cap = 1024 if entry.spec == "ddp-powersgd" else 25
            self.net: Any = DDP(self.model, bucket_cap_mb=cap)
            if entry.spec == "ddp-fp16":
                self.net.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif entry.spec == "ddp-powersgd":
                state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                                    start_powerSGD_iter=2, min_compression_rate=2, random_seed=seed)
                self.net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            self.opt = opt
        else:
            named = [(f"e{index}.{n}", p) for n, p in self.model.named_parameters()]
            if entry.spec == "stock-none":
                comp: Any = hvd.Compression.none
            elif entry.spec == "stock-fp16":
                comp = hvd.Compression.fp16
            else:
                comp = self.comp = gq.from_spec(entry.spec, named_parameters=named)
            self.net = self.model
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=named, compression=comp)

    def step(self, batch: int) -> tuple[float, float]:
        """One training step on a random batch of this rank's shard: (seconds, loss)."""
        import torch
        import torch.nn.functional as F

        x, y = self.data["x"], self.data["y"]
        idx = torch.randint(0, x.shape[0], (batch,), generator=self.gen)
        t = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.net(x[idx]), y[idx])
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t, float(loss.detach())

    def accuracy(self) -> float:
        import torch

        with torch.no_grad():
            pred = self.model(self.data["x_test"]).argmax(1)
        return float((pred == self.data["y_test"]).float().mean())

    def sent(self) -> tuple[int, int]:
        if self.comp is None:
            return 0, 0
        tot = self.comp.stats()["total"]["all"]
        return int(tot["sent"]), int(tot["received"])


def _compute_only(seed: int, lr: float, data: dict[str, Any], batch: int, steps: int) -> float:
    """Mean seconds of forward + backward + Adam with no communication at all (the compute floor)."""
    import torch
    import torch.nn.functional as F

    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    times = []
    for i in range(steps + 1):
        idx = torch.randint(0, data["x"].shape[0], (batch,))
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(data["x"][idx]), data["y"][idx]).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t)
    return sum(times) / len(times)


def worker(args: argparse.Namespace) -> None:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    raw = measure.load_mnist1d()
    xs, ys = measure.shard(raw["x"], raw["y"], rank, size)
    data = {"x": torch.from_numpy(xs), "y": torch.from_numpy(ys),
            "x_test": torch.from_numpy(raw["x_test"]), "y_test": torch.from_numpy(raw["y_test"])}
    entries = [e for e in ENTRIES if e.label in args.labels]
    out: dict[str, Any] = {"rank": rank, "size": size, "schemes": {}}
    params = sum(p.numel() for p in _model(0).parameters())
    out["params"] = params
    out["compute_s"] = _compute_only(args.seed, args.lr, data, args.batch, 3)
    hvd.allreduce(torch.zeros(1), name="e2e.warm")  # connections up before the idle phase
    netemu.phase("idle.a")
    time.sleep(args.idle)  # Horovod's background negotiation only: its rate, to tell it apart
    netemu.phase("idle.b")
    for i, e in enumerate(entries):
        tr = _Trainer(e, i, args.seed, args.lr, data)
        for _ in range(args.warmup):
            tr.step(args.batch)
        s0 = tr.sent()
        netemu.phase(f"s{i}.a")
        times = [tr.step(args.batch)[0] for _ in range(args.steps)]
        netemu.phase(f"s{i}.b")
        s1 = tr.sent()
        res: dict[str, Any] = {"times": times, "stats_sent": s1[0] - s0[0], "stats_received": s1[1] - s0[1]}
        if e.label in args.tta_labels:
            res["tta"] = _time_to_accuracy(e, i, args, data)
        out["schemes"][e.label] = res
        del tr
        if rank == 0:
            print(f"{DONE} {e.label}", flush=True)
    print(f"{TOKEN} {json.dumps(out)}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    hvd.shutdown()


def _time_to_accuracy(e: Entry, i: int, args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Train a fresh model with this scheme until the test accuracy reaches the target, once per
    seed (``--tta-seeds``: seeds ``--seed`` + 1, + 2, ...; the same seeds for every scheme, so the
    comparison is paired). Returns {"runs": [{"seed", "curve", "reached"}, ...]}."""
    import horovod.torch as hvd
    import torch

    runs = []
    for k in range(args.tta_seeds):
        seed = args.seed + 1 + k
        tr = _Trainer(e, 100 + i * 16 + k, seed, args.lr, data)
        elapsed, curve, reached = 0.0, [], None
        for step in range(1, args.tta_steps + 1):
            elapsed += tr.step(args.batch)[0]
            if step % args.tta_every == 0:
                acc = tr.accuracy()  # identical weights on every rank: each scores the whole test set
                t = float(hvd.allreduce(torch.tensor([elapsed]), op=hvd.Max, name=f"tta.{i}.{k}.{step}")[0])
                curve.append((step, t, acc))
                if acc >= args.tta_target:
                    reached = (step, t)
                    break
        runs.append({"seed": seed, "curve": curve, "reached": reached})
        del tr
    return {"runs": runs}


