"""MNIST-1D with a small 1-D CNN under ``horovod.torch``, gradients compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python bench/quality/train_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The CNN is the MNIST-1D paper's (three stride-2 convolutions of 25 channels, then a linear
layer; ~5k parameters). Adam (or ``--optimizer sgd``), a short warm-up, then cosine decay.
``--model mlp`` trains the quality study's MLP 40-300-300-10 instead (105,610 parameters,
``bench/quality/study_tasks.py``); with ``--optimizer sgd --weight-decay 5e-4 --warmup-frac 0.1`` it is
the study's recipe (the demo runs that). ``--eval-every N`` scores the test set every N steps
(the curve goes into the summary, with the training time excluding evaluation), and under
``bench/e2e/netbench.py`` the steps are bracketed by the phase marks ``train`` and ``trained`` so
the bytes that crossed each emulated link during training can be read apart from start-up.
``--compression`` takes any hvd_gradq spec (``HVD_GRADQ`` sets the default), or ``stock-none`` /
``stock-fp16`` for Horovod's own compression. Rank 0 prints the summary (and writes it with ``--json``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

import hvd_gradq.torch as gq  # noqa: E402
from bench import measure  # noqa: E402
from bench.netemu.counters import phase  # noqa: E402


class CNN(nn.Module):
    def __init__(self, channels: int = 25, length: int = 40, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        out = length
        for k in (5, 3, 3):
            out = (out + 2 - k) // 2 + 1
        self.linear = nn.Linear(channels * out, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(x.shape[0], 1, -1)
        h = F.relu(self.conv1(h))
        h = F.relu(self.conv2(h))
        h = F.relu(self.conv3(h))
        return self.linear(h.flatten(1))


def extra_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                    help="cnn: the MNIST-1D paper's CNN (~5k parameters); mlp: the quality study's MLP 40-300-300-10")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="the optimizer's weight decay (default 0)")
    ap.add_argument("--warmup-frac", type=float, default=0.0,
                    help="linear warm-up over this share of the steps (default 0: one epoch, at most a tenth)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="N",
                    help="score the test set every N steps as well as at the end (0: only at the end)")
    ap.add_argument("--dump-grads", default="", metavar="PATH",
                    help="save rank 0's local (uncompressed) gradients at a few steps to an .npz")
    ap.add_argument("--dump-steps", type=int, default=6, help="how many steps --dump-grads saves (evenly spaced)")


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set (each rank scores its shard)."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        loss = F.cross_entropy(logits, target, reduction="sum")
        correct = (logits.argmax(1) == target).sum()
    model.train()
    counts = torch.stack([correct.double(), loss.double(), torch.tensor(float(len(y)), dtype=torch.float64)])
    tot = hvd.allreduce(counts, op=hvd.Sum, name="example.eval")
    return float(tot[0] / tot[2]), float(tot[1] / tot[2])


def train(args: argparse.Namespace) -> dict:
    """One training run on the ranks Horovod was initialised with; every rank returns the summary.
    May be called again in the same process, for several runs per launch."""
    rank, size = hvd.rank(), hvd.size()
    data = measure.load_mnist1d()
    x, y = measure.shard(data["x"], data["y"], rank, size)
    xt, yt = measure.shard(data["x_test"], data["y_test"], rank, size)
    spe, total = measure.plan(len(x), args.batch_size, args.epochs, args.max_steps)
    warmup = max(1, round(args.warmup_frac * total)) if args.warmup_frac > 0 else measure.warmup_steps(spe, total)

    torch.manual_seed(args.seed)
    model: nn.Module
    if args.model == "mlp":
        from bench.quality.study_tasks import MLP  # the quality study's model, kept in one place

        model = MLP()
    else:
        model = CNN()
    named = list(model.named_parameters())
    sizes = [p.numel() for _, p in named]
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                              weight_decay=args.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    kind = measure.stock_kind(args.compression)
    if kind is not None:
        inner = hvd.Compression.fp16 if kind == "fp16" else hvd.Compression.none
        scheme = f"horovod {kind}"
    else:
        inner = gq.from_spec(args.compression, named_parameters=named, seed=args.seed)
        scheme = inner.scheme.spec
    timed = measure.TimedCompressor(inner)
    opt = hvd.DistributedOptimizer(opt, named_parameters=named, compression=timed, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    dump_at: set[int] = set()
    dumps: dict[str, np.ndarray] = {}
    if args.dump_grads:
        k = max(1, min(args.dump_steps, total))
        dump_at = {round(i * (total - 1) / max(1, k - 1)) for i in range(k)}

    clock = measure.StepClock(total)
    curve: list[dict[str, float]] = []  # test accuracy every --eval-every steps
    train_s = 0.0  # time inside training steps, evaluation excluded
    phase("train")  # bench/e2e/netbench.py reads every link's counters here (a no-op elsewhere)
    bar = measure.progress(rank, total, f"torch {args.compression}", args.quiet)
    step, epoch, losses = 0, 0, []
    t_start = time.perf_counter()
    while step < total:
        order = measure.epoch_order(len(x), args.seed, epoch, rank)
        epoch_losses = []
        for b in range(spe):
            if step >= total:
                break
            t0 = time.perf_counter()
            c0 = timed.total()
            for g in opt.param_groups:
                g["lr"] = measure.lr_at(step, total, warmup, args.lr)
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            xb, yb = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            if step in dump_at and rank == 0:  # local gradients: Horovod replaces them in step()
                for name, p in named:
                    dumps[f"step{step:05d}/{name}"] = p.grad.detach().numpy().copy()
            opt.step()
            dt = time.perf_counter() - t0
            clock.add(dt, timed.total() - c0)
            train_s += dt
            epoch_losses.append(loss.item())
            step += 1
            bar.update(1)
            if args.eval_every and (step % args.eval_every == 0 or step == total):
                a, _ = evaluate(model, xt, yt)
                curve.append({"step": step, "train_s": train_s, "wall_s": time.perf_counter() - t_start,
                              "accuracy": a})
                bar.set_postfix(epoch=epoch, loss=f"{epoch_losses[-1]:.3f}", acc=f"{100 * a:.1f}%", refresh=False)
            else:
                bar.set_postfix(epoch=epoch, loss=f"{epoch_losses[-1]:.3f}", refresh=False)
        losses = epoch_losses
        epoch += 1
    bar.close()
    wall = time.perf_counter() - t_start
    phase("trained")
    acc, test_loss = evaluate(model, xt, yt)

    stats = inner.stats() if kind is None else None
    summary = measure.make_summary(
        args, framework="torch", example="train_mnist1d", scheme=scheme, nranks=size, steps=total,
        epochs_run=round(total / spe, 3), n_params=sum(sizes), accuracy=acc, test_loss=test_loss,
        train_loss=float(np.mean(losses)) if losses else float("nan"), clock=clock,
        bytes_info=measure.bytes_summary(stats, kind, sizes, size, total), wall_s=wall,
    )
    summary.update({"model": args.model, "weight_decay": args.weight_decay, "warmup_steps": warmup,
                    "train_s": train_s, "curve": curve})
    if rank == 0 and args.dump_grads:
        Path(args.dump_grads).parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.dump_grads, **dumps)
        summary["dumped_grads"] = {"path": args.dump_grads, "steps": sorted(dump_at), "arrays": len(dumps)}
    return summary


def main() -> None:
    args = measure.parse_args(__doc__.split("\n")[0], extra_args)
    hvd.init()
    torch.set_num_threads(1)
    summary = train(args)
    if hvd.rank() == 0:
        measure.print_summary(summary)
        measure.write_json(args.json, summary)
        if args.dump_grads:
            print(f"  saved rank 0's local gradients at steps {summary['dumped_grads']['steps']} to {args.dump_grads}")


if __name__ == "__main__":
    main()
