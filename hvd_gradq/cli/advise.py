"""Which scheme for your job: bytes, modelled reduction time and the study's accuracy, per link rate.

Give the model as ``--params N`` (treated as 2-D tensors of at most 4M elements each: layer
sizes matter little once a tensor holds many buckets) or ``--state-dict FILE`` (a ``torch.save``
of a state dict or any nest of dicts of tensors; needs torch). From a state dict it counts what
Horovod reduces, the gradients: floating tensors, but not the buffers a state dict holds beside
the parameters, known by their names (the last part of the key: BatchNorm's ``running_mean``,
``running_var``, ``num_batches_tracked``: :data:`BUFFERS`), nor an optimizer's state (a dict
holding ``state`` and ``param_groups``, as ``opt.state_dict()`` makes); it says how many it left
out. For each candidate scheme the library's own policy picks each tensor's pattern at ``--ranks``
ranks, ``--ranks-per-host`` a host and each ``--link-gbps`` (``pattern=auto``, as a compressor
would), and its cost model gives the bytes over a host's link and the modelled reduction time
(link time plus this rank's encode and decode, from the CPU table measured on the project's
machine, or yours: ``python -m hvd_gradq calibrate --out FILE`` then ``--cpu-table FILE``, or
``HVD_GRADQ_CPU_TABLE=FILE``). Horovod's fp32 and fp16 allreduce are the same ring model with no
CPU term. The accuracy column is the quality study's (:mod:`.study`). The recommendation is the
fastest scheme whose accuracy the study saw kept with ``--optimizer``, or Horovod's fp16 when
none is modelled faster than it.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GradqError
from ..plan import cpu_cost
from ..plan.decide import cost, decide, fp16_cost, fp32_cost, seconds
from ..plan.pattern import Pattern
from ..spec import parse
from . import study

#: (label, spec as the study ran it, how to build it in code)
CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("ORQ-5", "orq:levels=5", "gq.ORQ()"),
    ("ORQ-3", "orq:levels=3", "gq.ORQ(levels=3)"),
    ("ORQ-9", "orq:levels=9", "gq.ORQ(levels=9)"),
    ("BinGrad+EF", "bingrad:ef=true", "gq.BinGrad()"),
    ("uniform-4", "uniform:bits=4", "gq.Uniform(bits=4)"),
    ("QSGD-4", "qsgd:levels=4", "gq.QSGD(levels=4)"),
    ("TernGrad", "terngrad", "gq.TernGrad()"),
    ("sign+EF", "sign:ef=true", "gq.Sign(ef=True)"),
    ("Top-K 1%+EF", "topk:ratio=0.01,ef=true", "gq.TopK(ratio=0.01, ef=True)"),
)
MAX_TENSOR = 1 << 22
#: State-dict entries that are buffers, not parameters (no gradient reaches Horovod), by the last
#: part of their key: BatchNorm's running statistics and its step count.
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", type=float, metavar="N", help="parameter count, e.g. 25e6")
    src.add_argument("--state-dict", type=Path, metavar="FILE", help="a torch.save'd state dict of the model")
    p.add_argument("--ranks", type=int, required=True, help="world size (hvd.size())")
    p.add_argument("--ranks-per-host", type=int, default=1, help="ranks on each host (default 1)")
    p.add_argument("--link-gbps", type=float, nargs="+", default=[1.0, 10.0], metavar="G",
                   help="link rates between hosts to advise for, Gbit/s (default: 1 10)")
    p.add_argument("--optimizer", choices=("sgd", "adamw", "any"), default="any",
                   help="sgd (momentum SGD), adamw (Adam, AdamW), or any (default: kept with both)")
    p.add_argument("--cpu-table", type=Path, metavar="FILE",
                   help="price encoding and decoding with this machine's table, written by `python -m hvd_gradq "
                        "calibrate --out FILE` (default: HVD_GRADQ_CPU_TABLE, else the project's table)")


def tensors_of(args: argparse.Namespace) -> tuple[list[tuple[int, int]], str]:
    """[(elements, ndim)] of the model and a line saying where they came from."""
    if args.params is not None:
        n = int(args.params)
        if n < 1:
            raise GradqError(f"--params must be a positive count, not {args.params:g}")
        sizes = [MAX_TENSOR] * (n // MAX_TENSOR) + ([n % MAX_TENSOR] if n % MAX_TENSOR else [])
        return [(k, 2) for k in sizes], (f"{n:,} parameters, modelled as {len(sizes)} tensor(s) of at most "
                                         f"{MAX_TENSOR:,} elements")
    try:
        import torch
    except ImportError:
        raise GradqError("--state-dict needs torch installed; give --params N instead") from None
    try:
        state = torch.load(args.state_dict, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as e:
        raise GradqError(f"--state-dict {args.state_dict}: cannot be read by torch.load ({e})") from None
    found, buffers, optimizer = gradients_in(state, torch.Tensor)
    if not found:
        raise GradqError(f"--state-dict {args.state_dict}: no floating-point parameters in it")
    left = ([f"{buffers} buffers ({', '.join(BUFFERS)})"] if buffers else []) + (
        [f"{optimizer} tensors of an optimizer's state"] if optimizer else [])
    out = f" (left out: {'; '.join(left)})" if left else ""
    return found, f"{sum(n for n, _ in found):,} parameters in {len(found)} tensors of {args.state_dict}{out}"


def gradients_in(state: Any, tensor: type[Any]) -> tuple[list[tuple[int, int]], int, int]:
    """[(elements, ndim)] of the tensors of a (nested) state dict that get gradients, then how
    many floating tensors were left out as buffers (:data:`BUFFERS`, by the last part of their
    key) and as an optimizer's state (a dict with ``state`` and ``param_groups``). ``tensor``:
    torch's class (this module imports torch only where a state dict is read)."""
    found: list[tuple[int, int]] = []
    left = {"buffers": 0, "optimizer": 0}

    def walk(v: Any, key: str) -> None:
        if isinstance(v, tensor):
            if v.is_floating_point() and v.numel():
                if key.rpartition(".")[2] in BUFFERS:
                    left["buffers"] += 1
                else:
                    found.append((v.numel(), v.dim()))
        elif isinstance(v, dict):
            if "state" in v and "param_groups" in v:  # an optimizer's state_dict: momenta, not parameters
                left["optimizer"] += len(_tensors(v, tensor))
                return
            for k, x in v.items():
                walk(x, str(k))
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, key)

    walk(state, "")
    return found, left["buffers"], left["optimizer"]


def _tensors(v: Any, tensor: type[Any]) -> list[Any]:
    if isinstance(v, tensor):
        return [v] if v.is_floating_point() and v.numel() else []
    items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else []
    return [t for x in items for t in _tensors(x, tensor)]


@dataclass
class Row:
    label: str
    spec: str
    code: str
    bytes: int
    seconds: float
    patterns: dict[str, int]


def model(spec: str, tensors: list[tuple[int, int]], ranks: int, local: int, gbps: float) -> tuple[int, float,
                                                                                                    dict[str, int]]:
    """(bytes over a host's link each way, modelled seconds, tensors by pattern) for one scheme."""
    config = parse(spec)
    scheme = config.scheme
    total_b, total_s = 0, 0.0
    patterns: dict[str, int] = {}
    for n, ndim in tensors:
        p = decide(config, n, ndim, ranks, Pattern.AUTO, local=local, link_gbps=gbps).pattern
        c = (fp32_cost(n, ranks) if p is Pattern.FP32 else fp16_cost(n, ranks) if p is Pattern.FP16
             else cost(scheme, n, ndim, ranks, p, local, gbps))
        total_b += max(c.sent, c.received)
        total_s += seconds(scheme, n, ndim, ranks, p, local, gbps)
        patterns[p.value] = patterns.get(p.value, 0) + 1
    return total_b, total_s, patterns


def run(args: argparse.Namespace) -> int:
    if args.ranks < 2:
        raise GradqError(f"--ranks must be at least 2 (at 1 rank nothing is exchanged), not {args.ranks}")
    if args.ranks_per_host < 1 or args.ranks % args.ranks_per_host:
        raise GradqError(f"--ranks-per-host must divide --ranks ({args.ranks}), not {args.ranks_per_host}")
    if not all(g > 0 for g in args.link_gbps):
        raise GradqError("--link-gbps takes rates above 0 Gbit/s")
    tab = cpu_cost.use_table(args.cpu_table) if args.cpu_table is not None else cpu_cost.table()
    tensors, source = tensors_of(args)
    ranks, local = args.ranks, args.ranks_per_host
    print(f"model: {source}; {ranks} ranks, {local} a host; optimizer: {args.optimizer}")
    for gbps in args.link_gbps:
        fp32 = sum(fp32_cost(n, ranks).sent for n, _ in tensors)
        fp16 = sum(fp16_cost(n, ranks).sent for n, _ in tensors)
        t16 = fp16 * 8 / (gbps * 1e9)
        rows = [Row(label, spec, code, *model(spec, tensors, ranks, local, gbps)) for label, spec, code in CANDIDATES]
        print(f"\n== {gbps:g} Gbit/s between hosts: Horovod fp32 allreduce moves {fp32 / 1e6:,.1f} MB a host "
              f"each way a step ({fp32 * 8 / (gbps * 1e9) * 1e3:,.1f} ms of link), fp16 {fp16 / 1e6:,.1f} MB "
              f"({t16 * 1e3:,.1f} ms)")
        head = f"{'scheme':12s} {'MB a step':>10s} {'fp32/this':>9s} {'model ms':>9s} " \
               f"{'% of fp16':>9s}  {'auto picks (tensors)':22s} accuracy vs fp32 (study)"
        print(head)
        print("-" * len(head))
        for r in rows:
            pats = ", ".join(f"{k} {v}" for k, v in sorted(r.patterns.items()))
            print(f"{r.label:12s} {r.bytes / 1e6:10,.2f} {fp32 / max(r.bytes, 1):8.1f}x "
                  f"{r.seconds * 1e3:9,.1f} {100 * r.seconds / t16:8.0f}%  {pats:22s} {study.describe(r.spec)}")
        ok = [r for r in rows if study.kept(r.spec, args.optimizer)]
        best = min(ok, key=lambda r: r.seconds) if ok else None
        kept = {"sgd": "within 1 point of fp32 with SGD at 4 and 8 workers",
                "adamw": "within 1% of fp32's loss with AdamW",
                "any": "within 1 point (SGD) and 1% (AdamW) of fp32"}[args.optimizer]
        if best is None or best.seconds >= t16:
            print(f"recommendation at {gbps:g} Gbit/s: Horovod's own compression=hvd.Compression.fp16: no scheme "
                  f"{kept} is modelled faster than it here (encoding costs more than the link saves)")
        else:
            print(f"recommendation at {gbps:g} Gbit/s: {best.label}, compression={best.code} (\"{best.spec}\"): "
                  f"{kept} in the study, {fp32 / best.bytes:.1f}x fewer bytes than fp32, modelled "
                  f"{t16 / best.seconds:.1f}x faster than Horovod fp16")
    yours = "; `python -m hvd_gradq calibrate --out FILE`, then --cpu-table FILE, for yours" \
        if tab is cpu_cost.SHIPPED else ""
    print(f"\nModelled, not measured: bytes from the payload format, time = link + this rank's encode/decode "
          f"(CPU: {tab.source}, one core a rank{yours}), no overlap with backward. Accuracy: "
          "results/quality/quality.md (5 seeds, MNIST-1D MLP and a small transformer).")
    return 0
