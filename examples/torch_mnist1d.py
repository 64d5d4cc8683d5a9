"""MNIST-1D with a small 1-D CNN under ``horovod.torch``, gradients compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/torch_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The CNN is the MNIST-1D paper's (three stride-2 convolutions of 25 channels, then a linear
layer; ~5k parameters), trained with Adam, a short warm-up, then cosine decay. Rank 0 prints the
test accuracy and the bytes the compressor sent (``--json`` writes them). The measured version
(step time, compressor time, Horovod's own compression) is ``bench/quality/train_mnist1d.py``.
"""
from __future__ import annotations

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from mnist1d_data import load_mnist1d, lr_at, parse_args, progress, report
from torch import nn

import hvd_gradq.torch as gq


class CNN(nn.Module):
    def __init__(self, channels: int = 25, length: int = 40, classes: int = 10) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, channels, 5, stride=2, padding=1),
                                    nn.Conv1d(channels, channels, 3, stride=2, padding=1),
                                    nn.Conv1d(channels, channels, 3, stride=2, padding=1)])
        out = length
        for k in (5, 3, 3):
            out = (out + 2 - k) // 2 + 1
        self.linear = nn.Linear(channels * out, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(x.shape[0], 1, -1)
        for conv in self.convs:
            h = F.relu(conv(h))
        return self.linear(h.flatten(1))


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set: each rank scores its shard, then one allreduce."""
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        loss = F.cross_entropy(logits, target, reduction="sum")
        correct = (logits.argmax(1) == target).sum()
    counts = torch.tensor([float(correct), float(loss), float(len(y))], dtype=torch.float64)
    tot = hvd.allreduce(counts, op=hvd.Sum, name="example.eval")
    return float(tot[0] / tot[2]), float(tot[1] / tot[2])


def main() -> None:
    args = parse_args(__doc__.split("\n")[0])
    hvd.init()
    torch.set_num_threads(1)  # several ranks share this machine's cores
    rank, size = hvd.rank(), hvd.size()
    x, y, xt, yt = load_mnist1d(rank, size)
    per_epoch = len(x) // args.batch_size
    total = per_epoch * args.epochs if not args.max_steps else min(args.max_steps, per_epoch * args.epochs)

    torch.manual_seed(args.seed)
    model = CNN()
    # The compressor: any hvd_gradq spec. named_parameters lets its state_dict be checked against the model.
    compression = gq.from_spec(args.compression, named_parameters=model.named_parameters(), seed=args.seed)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    bar = progress(rank, total, f"torch {args.compression}", args.quiet)
    rng = np.random.default_rng([args.seed, rank])
    for step in range(total):
        if step % per_epoch == 0:
            order = rng.permutation(len(x))
        idx = order[(step % per_epoch) * args.batch_size:][:args.batch_size]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args.lr)
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
        loss.backward()
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    bar.close()

    acc, test_loss = evaluate(model, xt, yt)
    if rank == 0:
        summary = {"example": "torch_mnist1d", "compression": args.compression, "ranks": size, "steps": total,
                   "test_accuracy": acc, "test_loss": test_loss}
        report(summary, compression.stats(), args.json)


if __name__ == "__main__":
    main()
