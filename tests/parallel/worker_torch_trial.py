"""auto's measured choice in a real job (hvd_gradq.plan.trial), several checks a launch.

``trial``: a model of many tensors trains through stock ``hvd.DistributedOptimizer`` with the
trial on (``fallback=True``; the harness turns it off for other workers): each rank records the
plan of every step; the trial ends; stats()['auto'] and the log line say what it measured.

``switch``: error feedback across plan switches, scripted (the trial's plan set by hand at each
step, no timing): a tensor that leaves compression for Horovod's fp32 delivers every residual it
held with that step (the oracle: the exact mean over ranks of gradient + residuals, gathered
raw), and holds none after it; back under compression it builds one again; fp16 likewise, to
fp16's rounding. Once with gather (own residuals) and once with scatter (own and the owner's
``#reduce`` residual on the chunk this rank owns). Weights end bitwise equal on every rank."""
from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import sys

import horovod.torch as hvd
import torch
from harness import report
from measuring_link import link_report, measuring

import hvd_gradq.torch as gq
from hvd_gradq.plan import trial as tr
from hvd_gradq.plan.layout import chunk_bounds

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True)
args = ap.parse_args()
hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()


def build(spec: str, widths: list[int], seed: int = 0, **options):
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])
    named = list(model.named_parameters())
    comp = gq.from_spec(spec, named_parameters=named, seed=3, **options)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=named,
                                   compression=comp)
    return model, opt, comp


def batch(step: int, width: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, width, generator=g), torch.randn(16, 1, generator=g)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def trial_mode() -> dict:
    stream, stderr = io.StringIO(), sys.stderr
    sys.stderr = stream  # the package's log writes to the sys.stderr of the moment (hvd_gradq.log)
    widths = [64, 256, 256, 128, 64, 32, 16, 8, 1]
    model, opt, comp = build("orq:ef=true", widths, fallback=True)
    plans = []
    for step in range(60):
        x, y = batch(step, widths[0])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        plans.append(comp.trial.plan)
    sys.stderr = stderr
    auto = comp.stats()["auto"]
    with measuring():  # a compressor whose handshake measures the link rate
        linked = gq.from_spec("orq")
        hvd.allreduce(torch.ones(4096), compression=linked, name="link.x")
    return {"plans": plans, "auto": auto, "digest": digest(model), "log": stream.getvalue(),
            "tensors": {k: v["pattern"] for k, v in comp.stats()["tensors"].items()},
            "link": link_report(linked.world())}


SCRIPT = ["compressed"] * 4 + ["fp32", "compressed", "compressed", "fp16", "compressed", "mixed", "compressed"]


def switch_mode(pattern: str) -> dict:
    widths = [40, 300, 1]  # the 300x40 weight is large enough that either pattern compresses it
    model, opt, comp = build("uniform:bits=4,ef=true", widths, pattern=pattern, link_gbps=1.0)
    script = tr.Trial(start=10**9)  # never runs on its own: the plan is set by hand below
    comp._measured.trial = script
    name = "0.weight"
    script.large = frozenset({name})  # mixed: the weight compressed, the rest fp16
    out = {"steps": []}
    for step, plan in enumerate(SCRIPT):
        x, y = batch(step, widths[0])
        opt.zero_grad()
        script.plan = plan  # decided in backward's hooks, where Horovod calls compress()
        p = dict(model.named_parameters())[name]
        held = {k: v.detach().clone() for k, v in comp._residuals.items() if k.startswith(name)}
        loss = torch.nn.functional.mse_loss(model(x), y)
        g = torch.autograd.grad(loss, p, retain_graph=True)[0].reshape(-1)  # the raw gradient, no hook runs
        loss.backward()
        # what this rank must deliver with an uncompressed step: its own residual, and the
        # owner residual (scatter) on the chunk this rank owns
        sent = g + held[name] if name in held else g
        if f"{name}#reduce" in held:
            lo, hi = chunk_bounds(g.numel(), comp.scheme.bucket, size)[rank]
            owner = torch.zeros_like(g)
            owner[lo:hi] = held[f"{name}#reduce"][: hi - lo]
            sent = sent + owner
        every_g = hvd.allgather(sent.reshape(1, -1), name=f"oracle.{pattern}.{step}")
        # stock Horovod on the same values: what the plan must equal bit for bit
        stock = hvd.allreduce(sent.clone(), op=hvd.Average, name=f"stock.{pattern}.{step}",
                              compression=hvd.Compression.fp16 if plan == "fp16" else hvd.Compression.none)
        opt.step()  # the reduced gradient, averaged, lands in p.grad before SGD uses it
        reduced = p.grad.detach().reshape(-1)
        after = sorted(k for k in comp._residuals if k.startswith(name))
        row = {"plan": plan, "held": sorted(held), "after": after, "pattern": comp.stats()["tensors"][name]["pattern"]}
        if plan in ("fp32", "fp16"):
            exact = every_g.double().mean(0)
            if plan == "fp16":  # Horovod's fp16: each rank's value cast, summed in fp16, cast back
                exact = every_g.half().float().double().mean(0)
            row["err"] = float((reduced.double() - exact).abs().max())
            row["stock_equal"] = bool(torch.equal(reduced, stock))
            row["scale"] = float(exact.abs().max())
        out["steps"].append(row)
    out["digest"] = digest(model)
    return out


if args.mode == "trial":
    report(rank, trial_mode())
else:
    report(rank, {"gather": switch_mode("gather"), "scatter": switch_mode("scatter")})
