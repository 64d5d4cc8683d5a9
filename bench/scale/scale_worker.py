"""One rank of :mod:`bench_scale`: a small MLP trained with each entry (an hvd_gradq scheme with a
pattern forced, or Horovod's own fp32/fp16) in turn, each entry's timed steps between two phase
marks at which the launcher reads every host's link counters (``bench_scale.py --worker``)."""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench import netemu

TOKEN = "SCALE_RESULT"
DONE = "SCALE_DONE"
#: Bytes of Ethernet (14) + IPv4 (20) + TCP with timestamps (32) headers on every packet (as in
#: e2e_worker): a link's TCP payload is its byte count less this per packet (ACKs carry none).
HEADER_BYTES = 66
#: The MLP: input, hidden widths, classes. 0.5M + 1M + 1M + 16k weights and four bias vectors
#: (2,640,912 parameters, 10.6 MB of fp32 gradient): big enough that the link, not per-tensor
#: overheads, sets the bytes; small enough for 8 ranks on 2 cores.
LAYERS = (512, 1024, 1024, 1024, 16)


@dataclass(frozen=True)
class Entry:
    """One run: ``spec`` is an hvd_gradq spec, or ``stock-fp32`` / ``stock-fp16`` (Horovod's own)."""

    spec: str
    pattern: str  # a Pattern value for hvd_gradq specs; "" for Horovod's own

    @property
    def stock(self) -> bool:
        return self.spec.startswith("stock-")

    @property
    def label(self) -> str:
        return f"{self.spec}@{self.pattern}" if self.pattern else self.spec


def shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of the model, in ``named_parameters`` order."""
    out: list[tuple[int, ...]] = []
    for a, b in itertools.pairwise(LAYERS):
        out += [(b, a), (b,)]
    return out


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for a, b in itertools.pairwise(LAYERS):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _trainer(e: Entry, index: int, seed: int) -> tuple[Any, Any, Any]:
    """(model, Horovod optimizer, hvd_gradq compressor or None) for entry ``e``."""
    import horovod.torch as hvd
    import torch

    import hvd_gradq.torch as gq

    model = _model(seed)
    named = [(f"e{index}.{n}", p) for n, p in model.named_parameters()]
    comp: Any = None
    if e.spec == "stock-fp32":
        compression: Any = hvd.Compression.none
    elif e.spec == "stock-fp16":
        compression = hvd.Compression.fp16
    else:
        # the scheme's own bytes against the model's (bench_scale.library_model): no fp16 fallback
        opts = {"fallback": False} if "fallback" in inspect.signature(gq.GradqCompressor).parameters else {}
        compression = comp = gq.from_spec(e.spec, named_parameters=named, pattern=e.pattern, **opts)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=named,
                                   compression=compression)
    return model, opt, comp


def worker(args: argparse.Namespace) -> None:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    entries = [Entry(**d) for d in json.loads(args.entries)]
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # deterministic synthetic data
    x = torch.randn(args.batch * 4, LAYERS[0], generator=gen)
    y = torch.randint(0, LAYERS[-1], (args.batch * 4,), generator=gen)
    out: dict[str, Any] = {"rank": rank, "size": hvd.size(), "local_size": hvd.local_size(), "runs": {}}
    hvd.allreduce(torch.zeros(1), name="scale.warm")  # every connection up before the idle phase
    netemu.phase("idle.a")
    time.sleep(args.idle)  # Horovod's background negotiation only: its rate, to subtract
    netemu.phase("idle.b")
    for i, e in enumerate(entries):
        model, opt, comp = _trainer(e, i, args.seed)
        times: list[float] = []
        for k in range(args.warmup + args.steps):
            if k == args.warmup:
                netemu.phase(f"s{i}.a")
            lo = (k % 4) * args.batch
            t = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x[lo:lo + args.batch]), y[lo:lo + args.batch]).backward()
            opt.step()
            times.append(time.perf_counter() - t)
        netemu.phase(f"s{i}.b")
        res: dict[str, Any] = {"times": times[args.warmup:], **asdict(e)}
        if comp is not None:
            last = comp.stats()["last_step"]
            res["patterns"] = {p: {"tensors": c["tensors"], "sent": c["sent"], "received": c["received"]}
                               for p, c in last.items() if p != "all"}
        out["runs"][e.label] = res
        del model, opt, comp
        if rank == 0:
            print(f"{DONE} {e.label}", flush=True)
    print(f"{TOKEN} {json.dumps(out)}", flush=True)
    hvd.shutdown()
