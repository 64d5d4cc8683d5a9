"""The quality study's two workloads, each a model, its data, its optimizer and its metric.

* ``mnist1d``: the paper's regime. MNIST-1D (Greydanus 2020; generated locally, never
  downloaded), an MLP 40-300-300-10 (105,610 parameters, all compressible but the biases), momentum
  SGD (0.9, Nesterov, weight decay 5e-4), global batch 256 split over the workers, 300 steps
  (22 epochs). 3,500 training
  signals, 500 held out for choosing the learning rate (``dev``), the 1,000 test signals reported.
* ``chars``: the regime most users are in. A decoder-only character transformer (4 layers,
  width 128, 4 heads, context 64; 0.83M parameters) trained with AdamW (betas 0.9/0.95, weight
  decay 0.1), global batch 32 windows, 150 steps, on the Python standard library's own sources
  (``*.py`` at the top of the running interpreter's ``lib/python3.X``, sorted by name: every
  machine with Python has them; bytes over 127 map to one symbol). The last 10% of the text is
  held out: its first half chooses the learning rate (``dev``), its second half is reported
  (``test``), as mean cross-entropy in nats.

Both use a linear learning-rate warm-up over the first 10% of steps, then cosine decay to 0.
Each worker gets its own slice of every global batch and computes its own gradient.
"""
from __future__ import annotations

import math
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.` imports


@dataclass(frozen=True)
class Task:
    name: str
    steps: int
    batch: int  # global, split evenly over the workers
    lrs: tuple[float, ...]
    metric: str  # what is reported
    higher_is_better: bool


TASKS = {
    "mnist1d": Task("mnist1d", 300, 256, (0.3, 0.6, 1.2), "test accuracy %", True),
    "chars": Task("chars", 150, 32, (2e-3, 4e-3, 8e-3), "test loss (nats)", False),
}


def lr_at(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 10)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1 + math.cos(math.pi * t))


# -- MNIST-1D ---------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(40, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mnist1d_data() -> dict[str, np.ndarray]:
    from bench import measure

    d = measure.load_mnist1d()
    return {"x": d["x"][:3500], "y": d["y"][:3500], "x_dev": d["x"][3500:], "y_dev": d["y"][3500:],
            "x_test": d["x_test"], "y_test": d["y_test"]}


# -- characters -------------------------------------------------------------------------------------
CTX, VOCAB = 64, 128


def stdlib_text() -> np.ndarray:
    lib = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in sorted(lib.glob("*.py")))
    a = np.frombuffer(data, np.uint8).astype(np.int64)
    return np.minimum(a, VOCAB - 1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, d: int = 128, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(CTX, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def chars_data() -> dict[str, np.ndarray]:
    a = stdlib_text()
    cut = int(len(a) * 0.9)
    held = a[cut:]
    return {"train": a[:cut], "dev": held[: len(held) // 2], "test": held[len(held) // 2 :]}


def windows(a: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(CTX + 1)[None, :]
    w = torch.from_numpy(a[idx])
    return w[:, :-1], w[:, 1:]


# -- the common interface ---------------------------------------------------------------------------
@dataclass
class Run:
    """One training run's moving parts."""

    model: nn.Module
    opt: torch.optim.Optimizer
    batches: Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]  # step -> one batch a worker
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module, str], float]  # split -> metric


def make_run(task: Task, data: dict[str, np.ndarray], workers: int, lr: float, seed: int) -> Run:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    per = task.batch // workers
    if task.name == "mnist1d":
        model: nn.Module = MLP()
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                                                     weight_decay=5e-4)
        x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
        n = len(x)
        order: list[np.ndarray] = []

        def batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            per_epoch = n // task.batch
            while len(order) <= step // per_epoch:
                order.append(rng.permutation(n))
            idx = order[step // per_epoch][(step % per_epoch) * task.batch :][: task.batch]
            return [(x[idx[r * per : (r + 1) * per]], y[idx[r * per : (r + 1) * per]]) for r in range(workers)]

        def loss(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(m(xb), yb)

        def evaluate(m: nn.Module, split: str) -> float:
            with torch.no_grad():
                pred = m(torch.from_numpy(data[f"x_{split}"])).argmax(1).numpy()
            return float(100.0 * (pred == data[f"y_{split}"]).mean())

        return Run(model, opt, batches, loss, evaluate)

    model = CharGPT()
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    train = data["train"]

    def char_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        starts = rng.integers(0, len(train) - CTX - 1, size=task.batch)
        return [windows(train, starts[r * per : (r + 1) * per]) for r in range(workers)]

    def char_loss(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(xb).reshape(-1, VOCAB), yb.reshape(-1))

    fixed = {s: np.linspace(0, len(data[s]) - CTX - 2, 256).astype(np.int64) for s in ("dev", "test")}

    def char_eval(m: nn.Module, split: str) -> float:
        with torch.no_grad():
            total = 0.0
            for i in range(0, 256, 64):
                xb, yb = windows(data[split], fixed[split][i : i + 64])
                total += float(char_loss(m, xb, yb)) * len(xb)
        return total / 256

    return Run(model, opt, char_batches, char_loss, char_eval)


def load_data(task: Task) -> dict[str, Any]:
    return mnist1d_data() if task.name == "mnist1d" else chars_data()
