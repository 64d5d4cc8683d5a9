"""Ordinary PyTorch training scripts that must work with hvd_gradq as they do with stock Horovod.

Modes (--mode), many checks per launch (imports cost seconds):
``cases`` (2 ranks): unused and rank-dependent parameters on every pattern, GradScaler mixed
precision (overflow skipped everywhere, residuals rolled back, scale changes exact),
``sparse_as_dense``, op/scale factors against stock Horovod, Adasum refused, the rank-0
checkpoint recipe, elastic refused, non-finite values carried through.
``sets`` (3 ranks): a process set of ranks 0 and 1 while rank 2 does other work.
``hosts`` (2 hosts x 2 ranks, fake_hosts.py): unused parameters with the hierarchical pattern, and
a process set of one rank a host (ranks 0 and 2) asking for it, while ranks 1 and 3 work alone.
``HVD_GRADQ_THREADS`` in the environment runs the same checks with that many worker threads.
"""
import argparse
import hashlib
import io
import os
import traceback

import horovod.torch as hvd
import torch
from harness import report

import hvd_gradq
import hvd_gradq.torch as gq

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True)
ap.add_argument("--only", default="", help="run only the checks whose key starts with one of these (comma-separated)")
args = ap.parse_args()
hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
out: dict = {}
SIM_CASES = [("orq:levels=5,ef=true", "scatter"), ("bingrad:ef=true,warmup=1", "gather"),
             ("qsgd:levels=4,ef=true", "summable"), ("uniform:bits=4", "auto"), ("orq:levels=3", "auto")]


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def check(key: str, f, *a) -> None:
    """Run one check; record its failure instead of stopping the launch (the test reports it)."""
    if not key.startswith(tuple(args.only.split(","))):
        return
    print(f"[rank {rank}] {key}", flush=True)
    try:
        out[key] = f(*a)
    except Exception:
        out[key] = "FAILED: " + traceback.format_exc()[-2500:]


class Branchy(torch.nn.Module):
    """A GAN/MoE-like model: ``a`` is used on rank 0 only, ``unused`` on no rank."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 700)
        self.a = torch.nn.Linear(700, 700)
        self.b = torch.nn.Linear(700, 700)
        self.unused = torch.nn.Linear(700, 700)
        self.out = torch.nn.Linear(700, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.a(h)) if rank == 0 else torch.tanh(self.b(h))
        return self.out(h)


def data(step: int, n: int = 16, dim: int = 16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, dim, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def unused_params(spec: str, pattern: str) -> dict:
    torch.manual_seed(0)
    model = Branchy()
    comp = gq.from_spec(spec, named_parameters=model.named_parameters(), pattern=pattern, seed=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {"digest": digest(model), "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
            "patterns": sorted(k for k in comp.stats()["total"] if k != "all")}


def scaler_run(spec: str, *, init_scale: float, growth_interval: int, use_scaler: bool, tell: bool,
               overflow_at: int = -1, steps: int = 8) -> dict:
    """The Horovod + GradScaler recipe: synchronize, unscale_, step under skip_synchronize, update."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 600), torch.nn.Tanh(), torch.nn.Linear(600, 3))
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval, enabled=use_scaler)
    comp = gq.from_spec(spec, named_parameters=model.named_parameters(), seed=5,
                        loss_scale=scaler.get_scale if (use_scaler and tell) else None)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    rec: dict = {"scales": [], "skipped": [], "residual_kept": None}
    for step in range(steps):
        x, y = data(step)
        if step == overflow_at and rank == 1:
            x[0, 0] = float("inf")
        before = digest(model)
        res_before = {k: v.clone() for k, v in comp._residuals.items()}
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        rec["scales"].append(float(scaler.get_scale()) if use_scaler else 1.0)
        rec["skipped"].append(digest(model) == before)
        if step == overflow_at:
            rec["residual_kept"] = bool(res_before) and all(torch.equal(res_before[k], comp._residuals[k])
                                                            for k in res_before)
    rec["digest"] = digest(model)
    rec["residuals_finite"] = all(bool(torch.isfinite(v).all()) for v in comp._residuals.values())
    return rec


def scale_changes(spec: str) -> dict:
    # Loss scales are powers of two and the schemes are scale-equivariant, so with loss_scale= a
    # run whose scale doubles every 2 steps equals the unscaled run bit for bit.
    plain = scaler_run(spec, init_scale=1.0, growth_interval=10**6, use_scaler=False, tell=False)
    told = scaler_run(spec, init_scale=2.0**4, growth_interval=2, use_scaler=True, tell=True)
    untold = scaler_run(spec, init_scale=2.0**4, growth_interval=2, use_scaler=True, tell=False)
    return {"plain": plain["digest"], "told": told["digest"], "untold": untold["digest"], "scales": told["scales"]}


def sparse_as_dense() -> dict:
    res = {}
    for spec in ("none", "orq:levels=5,ef=true", "qsgd:levels=4"):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(2000, 8, sparse=True)
        comp = gq.from_spec(spec, seed=2, pattern="gather" if spec == "none" else "auto")
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5), named_parameters=emb.named_parameters(),
                                       compression=comp, sparse_as_dense=True)
        hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
        for step in range(3):
            idx = torch.randint(0, 2000, (64,), generator=torch.Generator().manual_seed(step * 10 + rank))
            opt.zero_grad()
            emb(idx).pow(2).sum().backward()
            opt.step()
        res[spec] = {"digest": digest(emb), "compressed": comp.stats()["total"]["all"]["tensors"]}
    # the lossless scheme equals stock Horovod's sparse_as_dense run
    torch.manual_seed(0)
    emb = torch.nn.Embedding(2000, 8, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5), named_parameters=emb.named_parameters(),
                                   sparse_as_dense=True)
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    for step in range(3):
        idx = torch.randint(0, 2000, (64,), generator=torch.Generator().manual_seed(step * 10 + rank))
        opt.zero_grad()
        emb(idx).pow(2).sum().backward()
        opt.step()
    res["stock"] = {"digest": digest(emb)}
    return res


def scale_factors() -> dict:
    t = torch.randn(4096, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
    res = {}
    for i, (op, pre, post) in enumerate([(hvd.Sum, 0.25, 1.0), (hvd.Average, 1.0, 3.0), (hvd.Sum, 0.5, 4.0),
                                         (hvd.Average, 2.0, 0.5), (hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0)]):
        stock = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, name=f"stock{i}")
        ours = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, name=f"ours{i}",
                             compression=gq.from_spec("none", check_ranks=False, pattern="gather"))
        res[f"{i}"] = float((ours - stock).abs().max() / stock.abs().max())
    # DistributedOptimizer's gradient_predivide_factor goes through the same factors
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0), named_parameters=lin.named_parameters(),
                                   compression=gq.from_spec("none", pattern="gather"), gradient_predivide_factor=4.0)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    opt.zero_grad()
    lin(x).sum().backward()
    mine = lin.weight.grad.clone()
    opt.synchronize()
    expect = hvd.allreduce(mine, op=hvd.Average, name="predivide.expect")
    res["predivide"] = float((lin.weight.grad - expect).abs().max() / expect.abs().max())
    return res


def refused_ops() -> dict:
    res = {}
    lin = torch.nn.Linear(32, 32)
    try:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), named_parameters=lin.named_parameters(),
                                       compression=gq.ORQ(levels=5), op=hvd.Adasum)
        lin(torch.randn(4, 32)).sum().backward()
        opt.step()
        res["optimizer"] = "accepted"
    except hvd_gradq.GradqError as e:
        res["optimizer"] = str(e)
    for op_name, op in (("adasum", hvd.Adasum), ("max", hvd.Max)):
        try:
            hvd.allreduce(torch.randn(1000), op=op, name=f"refused.{op_name}", compression=gq.ORQ(levels=5))
            res[op_name] = "accepted"
        except hvd_gradq.GradqError as e:
            res[op_name] = str(e)
    return res


def checkpoint() -> dict:
    def make(seed: int = 0):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 400), torch.nn.Tanh(), torch.nn.Linear(400, 3))
        comp = gq.from_spec("orq:levels=5,ef=true", named_parameters=model.named_parameters(), seed=9)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                       named_parameters=model.named_parameters(), compression=comp)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt, comp

    def run(model, opt, a: int, b: int) -> None:
        for step in range(a, b):
            x, y = data(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    model, opt, comp = make()
    run(model, opt, 0, 10)
    full = digest(model)
    model, opt, comp = make()
    run(model, opt, 0, 5)
    state = comp.state_dict(all_ranks=True)  # a collective, on every rank
    buf = io.BytesIO()
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gradq": state}, buf)
    blob = hvd.broadcast_object(buf.getvalue(), root_rank=0)  # stands for a shared file system
    ck = torch.load(io.BytesIO(blob))
    model, opt, comp = make(seed=3)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    comp.load_state_dict(ck["gradq"])
    run(model, opt, 5, 10)
    # rank 0's own state (no all_ranks), loaded on every rank: steps kept, the others' residuals zero
    mine = sum(float(v.abs().sum()) for v in comp._residuals.values())
    plain = hvd.broadcast_object(comp.state_dict() if rank == 0 else None, root_rank=0, name="ck.plain")
    comp.load_state_dict(plain)
    return {"full": full, "resumed": digest(model), "residual_before": mine,
            "residual_after_rank0_state": sum(float(v.abs().sum()) for v in comp._residuals.values()),
            "steps_after_rank0_state": sum(comp._steps.values())}


def elastic() -> str:
    """In an elastic job a compressor is built, but one that no elastic state holds refuses its
    first step (nothing would restore or sync it); tests/parallel/test_elastic_torch.py runs one."""
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        comp = gq.ORQ(levels=5)
        comp.compress(torch.ones(4096))
        return "accepted"
    except hvd_gradq.GradqError as e:
        return str(e)
    finally:
        del os.environ["HOROVOD_ELASTIC"]


def nonfinite() -> dict:
    res = {}
    for spec, pattern in (("orq:levels=5", "gather"), ("qsgd:levels=4", "gather"), ("sign", "gather"),
                          ("topk:ratio=0.1", "gather"), ("fp16", "gather"), ("qsgd:levels=4", "summable"),
                          ("uniform:bits=4", "summable"), ("orq:levels=5", "scatter")):
        t = torch.randn(3000, generator=torch.Generator().manual_seed(rank))
        if rank == 1:
            t[1000] = float("inf")
        r = hvd.allreduce(t, name=f"nf.{spec}.{pattern}",
                          compression=gq.from_spec(spec, check_ranks=False, pattern=pattern))
        res[f"{spec}/{pattern}"] = {"any_nonfinite": bool((~torch.isfinite(r)).any()),
                     "first_bucket_finite": bool(torch.isfinite(r[:512]).all())}
    return res


def trained_pair(spec: str, pattern: str, seed: int):
    """A 16-700-3 model on every rank (broadcast), its compressor and DistributedOptimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 700), torch.nn.Tanh(), torch.nn.Linear(700, 3))
    comp = gq.from_spec(spec, named_parameters=model.named_parameters(), seed=seed, pattern=pattern)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, comp, opt


def warmup(spec: str, pattern: str) -> dict:
    """``warmup=2``: the first two steps of every tensor are Horovod's exact average (no residual
    written), the later ones compressed; compared with a plain allreduce of the same gradients."""
    model, comp, opt = trained_pair(spec, pattern, seed=5)
    errs, residuals = [], []
    for step in range(4):
        x, y = data(step)
        # the local gradients on the side: Horovod may already have averaged an fp32 pass-through
        # p.grad in place by the time backward() returns, so p.grad is not this rank's own
        local = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        mean = [hvd.allreduce(g, op=hvd.Average, name=f"wu.{spec}.{pattern}.{step}.{i}")
                for i, g in enumerate(local)]
        errs.append(max(float((p.grad - m).abs().max() / m.abs().max()) for p, m in zip(model.parameters(), mean)))
        residuals.append(len(comp.memory.store.residuals))
        with opt.skip_synchronize():
            opt.step()
    return {"errs": errs, "residuals": residuals, "digest": digest(model),
            "patterns": sorted(k for k in comp.stats()["total"] if k != "all")}


def simulator(spec: str, pattern: str) -> dict:
    """bench/quality/sim_reduce.py (the quality study's workers in one process) against this frontend:
    fed every rank's local gradients, it must give the bits ``DistributedOptimizer`` gave."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.quality.sim_reduce import SimReducer

    model, comp, opt = trained_pair(spec, pattern, seed=7)
    sim = SimReducer(hvd_gradq.parse(spec), size, seed=7, pattern=pattern)
    differ, compared = [], 0
    for step in range(3):
        x, y = data(step)
        # the local gradients on the side (autograd.grad runs no hooks): Horovod reduces fp32
        # pass-through tensors in place, so p.grad after backward() may already be the average
        local = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        sim.begin_step()
        for i, (name, p) in enumerate(model.named_parameters()):
            every = hvd.allgather(local[i].unsqueeze(0), name=f"sim.{spec}.{pattern}.{step}.{i}")
            expect = sim.reduce(name, [every[r] for r in range(size)])
            compared += 1
            if not torch.equal(expect, p.grad):
                differ.append(f"step {step} {name} ({sim.patterns[name]}): max diff "
                              f"{float((expect - p.grad).abs().max()):.3g}")
        with opt.skip_synchronize():
            opt.step()
    return {"differ": differ, "compared": compared, "patterns": sorted(set(sim.patterns.values()))}


if args.mode == "cases":
    for spec, pattern in [("qsgd:levels=4", "auto"), ("uniform:bits=4", "summable"), ("terngrad", "auto"),
                          ("orq:levels=5,ef=true", "scatter"), ("qsgd:levels=4,ef=true", "scatter"),
                          ("orq:levels=3", "gather")]:
        check(f"unused/{spec}/{pattern}", unused_params, spec, pattern)
    for spec in ("orq:levels=5,ef=true", "qsgd:levels=4,ef=true", "fp16", "topk:ratio=0.1,ef=true"):
        check(f"amp/{spec}", lambda s: scaler_run(s, init_scale=2.0**16, growth_interval=1000, use_scaler=True,
                                                  tell=True, overflow_at=3), spec)
    for spec in ("orq:levels=5,ef=true", "qsgd:levels=4,ef=true"):
        check(f"amp-scale/{spec}", scale_changes, spec)
    check("sparse_as_dense", sparse_as_dense)
    check("scale_factors", scale_factors)
    check("adasum", refused_ops)
    check("checkpoint", checkpoint)
    check("elastic", elastic)
    check("nonfinite", nonfinite)
    for spec, pattern in (("orq:levels=3,ef=true,warmup=2", "scatter"), ("bingrad:ef=true,warmup=2", "gather"),
                          ("qsgd:levels=4,warmup=2", "summable")):
        check(f"warmup/{spec}/{pattern}", warmup, spec, pattern)
    for spec, pattern in SIM_CASES:
        check(f"sim/{spec}/{pattern}", simulator, spec, pattern)
elif args.mode == "hosts":
    for spec in ("orq:levels=5,ef=true", "qsgd:levels=4", "bingrad"):
        check(f"unused/{spec}/hierarchical", unused_params, spec, "hierarchical")
    check("unused/orq:levels=3/auto", unused_params, "orq:levels=3", "auto")
    across = hvd.add_process_set([0, 2])
    alone = [hvd.add_process_set([1]), hvd.add_process_set([3])]
    if rank in (0, 2):
        res = {}
        for spec in ("orq:levels=5,ef=true", "none"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 700), torch.nn.Tanh(), torch.nn.Linear(700, 3))
            comp = gq.from_spec(spec, named_parameters=model.named_parameters(), seed=4, pattern="hierarchical")
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                           named_parameters=model.named_parameters(), compression=comp,
                                           process_set=across)
            x, y = data(0)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            local = [p.grad.clone() for p in model.parameters()]
            opt.synchronize()
            mean = [hvd.allreduce(g, op=hvd.Average, name=f"ref.{spec}.{i}", process_set=across)
                    for i, g in enumerate(local)]
            err = max(float((p.grad - m).abs().max() / m.abs().max()) for p, m in zip(model.parameters(), mean))
            with opt.skip_synchronize():
                opt.step()
            res[spec] = {"digest": digest(model), "rel_err": err,
                         "patterns": sorted(k for k in comp.stats()["total"] if k != "all")}
        out["sets"] = res
    else:
        out["sets"] = "idle"
        hvd.allreduce(torch.ones(10), name="alone", process_set=alone[rank // 2])
    hvd.barrier()
elif args.mode == "sets":
    # ranks 0 and 1 train on a process set; rank 2 is busy elsewhere (a hang if any collective
    # of the compressor used the global set). Adding a process set is collective: every rank adds both.
    pair = hvd.add_process_set([0, 1])
    solo = hvd.add_process_set([2])
    if rank in (0, 1):
        res = {}
        for spec, pattern in [("none", "gather"), ("none", "scatter"), ("qsgd:levels=4", "auto"),
                              ("orq:levels=5,ef=true", "auto"), ("orq:levels=5,ef=true", "scatter")]:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 700), torch.nn.Tanh(), torch.nn.Linear(700, 3))
            comp = gq.from_spec(spec, named_parameters=model.named_parameters(), seed=4, pattern=pattern)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                           named_parameters=model.named_parameters(), compression=comp,
                                           process_set=pair)
            x, y = data(0)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            local = [p.grad.clone() for p in model.parameters()]
            opt.synchronize()
            mean = [hvd.allreduce(g, op=hvd.Average, name=f"ref.{spec}.{pattern}.{i}", process_set=pair)
                    for i, g in enumerate(local)]
            err = max(float((p.grad - m).abs().max() / m.abs().max()) for p, m in zip(model.parameters(), mean))
            with opt.skip_synchronize():
                opt.step()
            res[f"{spec}/{pattern}"] = {"digest": digest(model), "rel_err": err,
                                        "compressed": comp.stats()["total"]["all"]["tensors"]}
        # a compressor built for another set than the optimizer's is refused with a clear error
        try:
            lin = torch.nn.Linear(300, 300)
            comp = gq.ORQ(levels=5, process_set=hvd.global_process_set)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                           named_parameters=lin.named_parameters(), compression=comp, process_set=pair)
            lin(torch.randn(4, 300)).sum().backward()
            opt.step()
            res["mismatch"] = "accepted"
        except hvd_gradq.GradqError as e:
            res["mismatch"] = str(e)
        out["sets"] = res
    else:
        out["sets"] = "idle"
        hvd.allreduce(torch.ones(10), name="rank2.alone", process_set=solo)
    hvd.barrier()
report(rank, out)
