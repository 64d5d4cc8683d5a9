"""5 steps of a tiny model under stock hvd.DistributedOptimizer; report a digest of the weights.

``--perturb-rank R`` changes one parameter on rank R after training (to show the harness catches
disagreeing ranks); ``--hang-rank R`` makes rank R sleep forever at step ``--hang-step`` (2; 0:
before its first step, so it never joins a compressor's handshake), to show hangs are caught.
"""
import argparse
import hashlib
import time

import horovod.torch as hvd
import torch
from harness import report

ap = argparse.ArgumentParser()
ap.add_argument("--perturb-rank", type=int, default=-1)
ap.add_argument("--hang-rank", type=int, default=-1)
ap.add_argument("--hang-step", type=int, default=2)
ap.add_argument("--compression", default="")
args = ap.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compression = hvd.Compression.none
if args.compression:
    import hvd_gradq.torch as gq

    compression = gq.from_spec(args.compression, named_parameters=model.named_parameters())
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(100 + hvd.rank())
for step in range(5):
    if hvd.rank() == args.hang_rank and step == args.hang_step:
        time.sleep(10**6)
    x = torch.randn(32, 8, generator=gen)
    y = torch.randint(0, 2, (32,), generator=gen)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
if hvd.rank() == args.perturb_rank:
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
report(hvd.rank(), {"digest": h.hexdigest(), "loss": float(loss), "size": hvd.size()})
