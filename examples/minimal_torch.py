"""The smallest real hvd_gradq training script (PyTorch): a small MLP learns a random linear map from
synthetic data, its gradients sent as ORQ with 5 levels (``gq.ORQ()``: the README's "Which scheme" pick
when unsure of the optimizer).

    horovodrun -np 2 -H localhost:2 .venv/bin/python examples/minimal_torch.py
"""
import hashlib

import horovod.torch as hvd
import torch

import hvd_gradq.torch as gq

hvd.init()
torch.set_num_threads(1)  # the ranks share this machine's cores
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
compression = gq.ORQ(named_parameters=model.named_parameters())  # ORQ-5, no error feedback
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(), compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every rank starts from rank 0's weights
hvd.broadcast_optimizer_state(opt, root_rank=0)

target = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))  # the same map on every rank
data = torch.Generator().manual_seed(1000 + hvd.rank())  # each rank its own samples
losses = []
for _ in range(200):
    x = torch.randn(64, 32, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x @ target)
    opt.zero_grad()
    loss.backward()
    opt.step()  # compress, exchange, decode: the same averaged gradient on every rank
    losses.append(loss.item())

weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
sent = compression.stats()["total"]["all"]
print(f"rank {hvd.rank()}: loss {sum(losses[:10]) / 10:.4f} -> {sum(losses[-10:]) / 10:.4f}, weights {weights}, "
      f"sent {sent['sent']} B, x{sent['ratio_vs_fp32']:.1f} less than fp32", flush=True)
