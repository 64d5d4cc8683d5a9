"""ORQ's exact level search for s = 4, 5 as torch tensor ops, every bucket at once.

:mod:`hvd_gradq.kernels.orq_levels` solves s = 4, 5 in O(w) a bucket after the sort, and that
part has no data-dependent control flow worth keeping sequential: layer 2 is the closed form
F_2(j) = C2(0, j) for every j (its argmin m_j = ceil(j - P1_{j+1} / y_j) clamped to 0..j), and
the last one or two levels are one argmin over i of F_2(i) + C(i, w-1) (s = 4, i from layer 2's
argmin at w-1) or F_2(i) + C2(i, w-1) (s = 5). Here each of those is an elementwise expression
over a (buckets, w) tensor and an argmin along the rows, so a CUDA gradient's buckets never go to
the host for their levels (the host search stays for s >= 6, whose divide and conquer is
sequential, and for BinGrad-pb; BinGrad-b and ORQ-2/3 were already in-graph).

Bit-identical to the host search, not merely as good: every float64 expression below is the host
source's, operand for operand and in the same association (``(a * b) * c``, ``(a - b) - c``),
with IEEE division and no fused multiply-add (torch evaluates each operator as its own
elementwise kernel), and the argmin keeps the first index on ties (``torch.argmin`` promises the
first minimal index; a masked-out candidate is +inf, which the host's strict ``<`` never takes
either). The one operation whose order is not written out is the prefix sum: the host adds
y_0, y_1, ... one after another, and ``torch.cumsum`` on a CPU tensor does exactly that (one
sequential accumulator in float64, checked against a Python loop in
``tests/unit/test_device_levels.py``), so on CPU the indices, levels and payload bytes are the
host's to the bit. A CUDA ``cumsum`` is a parallel scan whose sums can differ in the last bit;
the levels are then the exact optimum of sums rounded differently, so where two level sets tie
to within float64 rounding the device may pick the other one. That changes no correctness
property (the payload carries the levels each rank chose; decoding reads them), only the
host-path digest equality, which the tests check on CPU tensors.
"""
from __future__ import annotations

import torch

from ..errors import GradqError

#: The level counts this module searches (the others go through ``Ops.host``).
LEVELS = (4, 5)


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(t, 1, idx)


def level_indices(ys: torch.Tensor, s: int) -> torch.Tensor:
    """Indices (rows, s), int64, of ORQ's optimal levels of sorted float64 rows ``ys`` (rows, w),
    the same as :func:`hvd_gradq.kernels.search.level_indices` (on CPU tensors, to the bit)."""
    if s not in LEVELS:
        raise GradqError(f"orq device search: levels={s}; it takes levels 4 or 5 (others run on the host)")
    if ys.dim() != 2 or ys.dtype != torch.float64:
        raise GradqError(
            f"orq device search: needs sorted float64 rows (rows, width), got {tuple(ys.shape)} {ys.dtype}")
    rows, w = int(ys.shape[0]), int(ys.shape[1])
    dev = ys.device
    if rows == 0 or w == 0:
        return torch.zeros((rows, s), dtype=torch.int64, device=dev)
    y = ys - ys[:, :1]  # shifted to start at 0, as the host does (keeps the cancellation small)
    zero = torch.zeros((rows, 1), dtype=torch.float64, device=dev)
    p1 = torch.cat([zero, torch.cumsum(y, 1)], 1)  # (rows, w+1): sums before each index
    p2 = torch.cat([zero, torch.cumsum(y * y, 1)], 1)
    kf = torch.arange(w, dtype=torch.float64, device=dev).reshape(1, w)
    ki = torch.arange(w, dtype=torch.int64, device=dev).reshape(1, w)
    hh = kf * y - p1[:, :w]
    one = torch.ones((), dtype=torch.float64, device=dev)
    inf = torch.full((), float("inf"), dtype=torch.float64, device=dev)

    # layer 2: F_2(j) = C(0, m) + C(m, j), m = ceil(j - P1_{j+1} / y_j) clamped to 0..j
    p1n = p1[:, 1:]  # P1_{j+1}
    p2n = p2[:, 1:]
    pos = y > 0.0
    ratio = p1n / torch.where(pos, y, one)
    m = torch.where(pos, torch.minimum(torch.clamp(torch.ceil(kf - ratio), min=0.0), kf), torch.zeros_like(y))
    a0 = m.to(torch.int64)
    ym = _gather(y, a0)
    p1m, p2m = _gather(p1, a0), _gather(p2, a0)
    p1m1, p2m1 = _gather(p1, a0 + 1), _gather(p2, a0 + 1)
    nn = (ki - a0 + 1).to(torch.float64)
    f0 = (ym * p1m1 - p2m1) + ((ym + y) * (p1n - p1m) - (p2n - p2m) - nn * ym * y)

    out = torch.empty((rows, s), dtype=torch.int64, device=dev)
    out[:, 0] = 0
    out[:, s - 1] = w - 1
    yl = y[:, w - 1 : w]  # y_{w-1}
    pw1, pw2 = p1[:, w : w + 1], p2[:, w : w + 1]
    if s == 4:  # F_2(i) + C(i, w-1) for i >= layer 2's argmin at w-1
        k1 = pw1 - float(w) * yl
        v = (f0 + p2[:, :w] - y * p1[:, :w]) + y * k1 + yl * hh
        lo = a0[:, w - 1 : w]
        bi = torch.argmin(torch.where(ki >= lo, v, inf), 1, keepdim=True)
        bi = torch.maximum(bi, lo)  # the host's start when nothing beats +inf
        out[:, 2:3] = bi
    else:  # F_2(i) + C2(i, w-1): level 2 at i, level 3 at the closed-form middle of i .. w-1
        span = yl - y
        spos = span > 0.0
        tt = (pw1 - p1[:, :w]) - (float(w) - kf) * y
        mm = torch.ceil(float(w - 1) - tt / torch.where(spos, span, one))
        mm = torch.where(spos, torch.clamp(torch.maximum(mm, kf), max=float(w - 1)), kf)
        mi = mm.to(torch.int64)
        ym = _gather(y, mi)
        p1m, p2m = _gather(p1, mi), _gather(p2, mi)
        p1m1, p2m1 = _gather(p1, mi + 1), _gather(p2, mi + 1)
        v = f0 + ((y + ym) * (p1m1 - p1[:, :w]) - (p2m1 - p2[:, :w]) - (mm - kf + 1.0) * y * ym) + (
            (ym + yl) * (pw1 - p1m) - (pw2 - p2m) - (float(w) - mm) * ym * yl)
        bi = torch.argmin(v, 1, keepdim=True)
        out[:, 2:3] = bi
        out[:, 3:4] = _gather(mi, bi)
    out[:, 1:2] = _gather(a0, out[:, 2:3])
    return out


def levels(x: torch.Tensor, s: int) -> torch.Tensor:
    """ORQ's ``s`` levels (rows, s), float32, of buckets ``x`` (rows, w) on ``x``'s device: what
    :func:`hvd_gradq.kernels.search.levels` returns on the host (sort in float32, search in
    float64; the levels are data points, so float32 holds them exactly)."""
    if x.dim() != 2:
        raise GradqError(f"orq levels: buckets must be 2-D (rows, width), got shape {tuple(x.shape)}")
    ys = torch.sort(x.to(torch.float32), dim=1).values.to(torch.float64)
    idx = level_indices(ys, s)
    if ys.shape[1] == 0:
        return torch.zeros((int(ys.shape[0]), s), dtype=torch.float32, device=x.device)
    return torch.gather(ys, 1, idx).to(torch.float32)
