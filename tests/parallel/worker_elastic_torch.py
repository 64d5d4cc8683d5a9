"""An elastic Horovod job with ORQ-5+EF, ``pattern=scatter``: 2 ranks, then 3, then 2 again after a
worker is killed in the middle of a step (``test_elastic_torch.py`` drives the host schedule).

Every rank appends JSON events to ``<out>/<pid>.jsonl``:

* ``sync``: at the start of each rendezvous (after Horovod's reset and the state's sync): rank,
  size, the compressor's generation, the hash of its worker residuals, and the hash of those
  residuals at this rank's last commit (equal after a restore: the failed step left nothing);
* ``step``: after each step, whether every rank's parameters hash the same (an allgather), the
  owner residuals' world (:mod:`hvd_gradq.frontend.elastic`);
* ``epoch`` (rank 0): the loss over the whole data set.

The epoch log that drives the discovery script is ``--epochs-log``: rank 0 adds a line at the end of
each epoch and waits until Horovod has noticed a host change that the schedule makes then, as
Horovod's own elastic test mains do. The worker on host 127.0.0.1 kills itself (SIGKILL) inside
backward at ``--kill-at`` (epoch, batch), after some of its gradients' collectives have started.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from elastic_run import worker_parser

import hvd_gradq.torch as gq
from hvd_gradq.feedback import parameter_of
from hvd_gradq.torch.elastic import world

parser = worker_parser()
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
HOST = os.environ.get("HOROVOD_HOSTNAME", "")
OUT = Path(args.out, f"{os.getpid()}.jsonl")
KILL_EPOCH, KILL_BATCH = (int(v) for v in args.kill_at.split(","))
MARK = Path(args.out, "killed")

g = torch.Generator().manual_seed(1)
X = torch.randn(240, 32, generator=g)
Y = (X[:, :4].sum(dim=1) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
compression = gq.ORQ(levels=5, ef=True, pattern="scatter", named_parameters=model.named_parameters(), seed=3)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                     named_parameters=model.named_parameters(), compression=compression)


def emit(kind: str, **fields: Any) -> None:
    with OUT.open("a") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), "host": HOST, **fields}) + "\n")


def params_hash() -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def worker_residuals(residuals: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(residuals):
        if parameter_of(k) == k:
            h.update(k.encode() + residuals[k].numpy().tobytes())
    return h.hexdigest()


def kill_hook(p: torch.Tensor) -> None:
    """Inside backward, after the last layer's gradients went to the compressor."""
    if (state.epoch, state.batch) == (KILL_EPOCH, KILL_BATCH) and HOST == "127.0.0.1" and not MARK.exists():
        MARK.write_text(str(os.getpid()))
        emit("kill", rank=hvd.rank(), steps=dict(compression._steps))
        os.kill(os.getpid(), signal.SIGKILL)


model[0].weight.register_post_accumulate_grad_hook(kill_hook)


@hvd.elastic.run
def train(state: Any) -> None:
    e = compression._elastic
    saved = e.saved.residuals if e.saved is not None else {}
    emit("sync", rank=hvd.rank(), size=hvd.size(), generation=e.generation.number, epoch=state.epoch,
         batch=state.batch, residuals=worker_residuals(compression._residuals), committed=worker_residuals(saved),
         params=params_hash(), steps=sum(compression._steps.values()))
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            rank, size = hvd.rank(), hvd.size()
            idx = torch.arange(state.batch * 48, (state.batch + 1) * 48)[rank::size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(X[idx]), Y[idx])
            loss.backward()
            optimizer.step()
            hashes = hvd.allgather_object(params_hash(), name=f"check.{e.generation.number}")
            owners = [k for k in compression._residuals if parameter_of(k) != k]
            emit("step", rank=rank, size=size, generation=e.generation.number, epoch=state.epoch, batch=state.batch,
                 equal=len(set(hashes)) == 1, owners=len(owners), owners_world=str(e.made_in),
                 world=str(world()))
            state.batch += 1
            state.commit()
        if hvd.rank() == 0:
            with torch.no_grad():
                full = float(F.cross_entropy(model(X), Y))
            emit("epoch", epoch=state.epoch, loss=full, size=hvd.size())
            with open(args.epochs_log, "a") as f:
                f.write(f"{state.epoch}\n")
            if state.epoch == args.grow_after:  # the schedule adds a host now: wait until Horovod says so
                state._last_updated_timestamp = 0
                start = time.monotonic()
                while state._host_messages.empty():
                    if time.monotonic() - start > 30:
                        raise TimeoutError("no host update from the driver within 30 s")
                    time.sleep(0.1)
        state.epoch += 1
        state.batch = 0
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
train(state)
emit("done", rank=hvd.rank(), size=hvd.size(), params=params_hash())
