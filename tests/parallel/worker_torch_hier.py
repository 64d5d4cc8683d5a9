"""The hierarchical pattern on several "hosts" of several ranks (launched by fake_hosts.py).

Every check runs in one launch; the test reads each rank's report. The oracle allgathers every
rank's raw gradient and recomputes the pattern in NumPy from its description (host sums in local
rank order, each owner's piece quantized with its own seed and residual, summed in host order;
with the cross-host scatter, sub-pieces, their sums re-quantized finer with their own residual),
with the NumPy reference codec (numba kernels off), so neither the pattern's code nor the
kernels can agree with themselves.
"""
import argparse
import hashlib
import os
import time
import traceback

import draws
import horovod.torch as hvd
import numpy as np
import torch
from fallback_figures import alone, measured_as
from harness import report

import hvd_gradq
import hvd_gradq.torch as gq
from hvd_gradq import kernels
from hvd_gradq.plan.decide import cost, decide, hier_cross
from hvd_gradq.plan.layout import chunk_bounds
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.plan.second_phase import reduced_scheme
from hvd_gradq.reduce import codec
from hvd_gradq.torch import transport
from hvd_gradq.wire.payload import header_size

ap = argparse.ArgumentParser()
ap.add_argument("--link", type=float, required=True)
args = ap.parse_args()
hvd.init()
torch.set_num_threads(1)
rank, size, L = hvd.rank(), hvd.size(), hvd.local_size()
H = size // L
out: dict = {"layout": [rank, hvd.local_rank(), L, hvd.cross_rank(), hvd.cross_size()]}


def check(key: str, f, *a) -> None:
    print(f"[rank {rank}] {key}", flush=True)
    try:
        out[key] = f(*a)
    except Exception:
        out[key] = "FAILED: " + traceback.format_exc()[-2500:]


def encode(scheme, x: np.ndarray, owner: int, step: int, key: str) -> np.ndarray:
    with kernels.disabled():
        _, own = codec.encode(scheme, x, draws.words(0, owner, key, step), "oracle")
    return own


def oracle(scheme, policy, name: str, grads: np.ndarray, step: int, res: dict) -> np.ndarray:
    """The sum over every rank as the hierarchical pattern defines it (``res``: residuals by owner)."""
    n = grads.shape[1]
    cross = hier_cross(scheme, n, size, L, args.link)
    key = name + "#host"
    outs = []
    for i, (lo, hi) in enumerate(chunk_bounds(n, scheme.bucket, L)):
        host_sums = []
        for h in range(H):
            t = grads[h * L, lo:hi].copy()
            for j in range(1, L):
                t = t + grads[h * L + j, lo:hi]
            host_sums.append(t)

        def quantize(sch, x, owner, k):
            if policy.ef:
                x = x + res.get((owner, k), 0)
            own = encode(sch, x, owner, step, k)
            if policy.ef:
                res[(owner, k)] = x - own
            return own

        if cross is Pattern.GATHER:
            owns = [quantize(scheme, host_sums[h], h * L + i, key) for h in range(H)]
            total = owns[0].copy()
            for o in owns[1:]:
                total = total + o
        else:
            subs = chunk_bounds(hi - lo, scheme.bucket, H)
            owns = []
            for h in range(H):  # the owner's residual covers its whole piece, one key
                owner = h * L + i
                x = host_sums[h] + res.get((owner, key), 0) if policy.ef else host_sums[h]
                owns.append([encode(scheme, x[a:b], owner, step, f"{key}#{k}") for k, (a, b) in enumerate(subs)])
                if policy.ef:
                    res[(owner, key)] = x - np.concatenate(owns[-1])
            parts = []
            for k in range(H):
                p = owns[0][k].copy()
                for h in range(1, H):
                    p = p + owns[h][k]
                parts.append(quantize(reduced_scheme(scheme, H), p, k * L + i, key + "#reduce"))
            total = np.concatenate(parts)
        outs.append(total)
    return np.concatenate(outs), cross


def reduce_once(comp, name: str, g: torch.Tensor, op) -> tuple[torch.Tensor, object]:
    g = g.clone()
    g._hvd_gradq_name = name
    dummy, ctx = comp.compress(g)
    dummy = hvd.allreduce(dummy, op=op, name=f"dummy.{name}")
    return comp.decompress(dummy, ctx), ctx


def oracle_case(spec: str, n: int, op=hvd.Sum) -> dict:
    config = hvd_gradq.parse(spec)
    scheme, policy = config.scheme, config.policy
    name = f"t.{spec}.{n}"
    comp = gq.from_spec(spec, named_parameters=[(name, torch.nn.Parameter(torch.zeros(n)))], pattern="hierarchical")
    res: dict = {}
    bad, digests, used = [], [], set()
    for step in range(3):
        g = torch.from_numpy(np.random.default_rng(1000 * step + rank).standard_t(3, n).astype(np.float32))
        got, ctx = reduce_once(comp, name, g, op)
        allg = hvd.allgather(g[None], name=f"x.{name}.{step}").numpy()
        want, cross = oracle(scheme, policy, name, allg, step, res)
        used.add(f"{ctx.choice.pattern.value}/{ctx.choice.cross.value}/{cross.value}")  # taken / its cross / the oracle's
        if op == hvd.Average:
            want = want / size
        if not np.array_equal(got.numpy(), want.astype(np.float32)):
            bad.append(step)
        digests.append(hashlib.sha256(got.numpy().tobytes()).hexdigest()[:16])
    # bytes this rank sent to other hosts, from the payload format's sizes: its whole piece to
    # H-1 hosts (gather), or its sub-pieces to their owners and its finer reduced sub-piece to
    # H-1 hosts (scatter); the model's figure for its piece (the largest sub-piece standing
    # for its own) is within one bucket's payload of that
    lo, hi = chunk_bounds(n, scheme.bucket, L)[hvd.local_rank()]
    if cross is Pattern.GATHER:
        exact = (H - 1) * (header_size(scheme.spec, 1) + scheme.nbytes(hi - lo))
    else:
        subs = [b - a for a, b in chunk_bounds(hi - lo, scheme.bucket, H)]
        fine = reduced_scheme(scheme, H)
        me = hvd.cross_rank()
        exact = sum(header_size(scheme.spec, 1) + scheme.nbytes(k) for j, k in enumerate(subs) if j != me)
        exact += (H - 1) * (header_size(fine.spec, 1) + fine.nbytes(subs[me]))
    sent = comp.stats()["last_step"]["hierarchical"]["sent"]
    model = cost(scheme, hi - lo, 1, H, cross).sent
    # the model's error: each of the H-1 reduced payloads and the alltoall's largest-for-own
    # substitution are off by at most one bucket's payload
    slack = H * (scheme.nbytes(scheme.bucket) + reduced_scheme(scheme, H).nbytes(scheme.bucket))
    return {"bad": bad, "digests": digests, "ctx": sorted(used), "cross": cross.value, "sent": sent,
            "exact_sent": exact, "model_sent": model, "slack": slack}


SPECS = ["orq:levels=5", "orq:levels=3,ef=true", "bingrad", "qsgd:levels=4,ef=true", "uniform:bits=4", "terngrad",
         "none"]
for spec in SPECS:
    check(f"oracle|{spec}", oracle_case, spec, 5000)
check("oracle|orq:levels=5|big|Average", oracle_case, "orq:levels=5", 40000, hvd.Average)


def auto_case() -> dict:
    """pattern=auto takes hierarchical where the model says so; a training run stays identical."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    extra = torch.nn.Linear(5, 5)  # never used: no gradient on any rank
    named = list(model.named_parameters()) + [("extra." + k, v) for k, v in extra.named_parameters()]
    hvd.broadcast_parameters(dict(named), root_rank=0)
    comp = gq.from_spec("orq:levels=5,ef=true", named_parameters=named)
    params = list(model.parameters()) + list(extra.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.05), named_parameters=named, compression=comp)
    rng = np.random.default_rng(rank)
    for _ in range(3):
        x = torch.from_numpy(rng.standard_normal((16, 64)).astype(np.float32))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()[:16]
    # the model with what the compressor decides by: its fallback setting and the agreed CPU figures
    want = decide(hvd_gradq.parse("orq:levels=5,ef=true"), 64 * 300, 2, size, Pattern.AUTO, local=L,
                  link_gbps=args.link, fallback=comp.fallback, figures=comp._figures[""]).pattern
    patterns = sorted(k for k in comp.stats()["last_step"] if k != "all")
    return {"digest": h, "want": want.value, "patterns": patterns}


check("auto", auto_case)


def fallback_case() -> dict:
    """pattern=auto across ranks that measured different CPU figures: every rank holds the same
    agreed figures (the maximum) and decides alike, with fallback on or off (PyTorch measures its
    plans on DistributedOptimizer's steps instead of the model's fp16 fallback: plan/trial.py)."""
    spec, n, link = "orq:levels=5", 1 << 16, 10.0
    with measured_as(rank):
        g = torch.from_numpy(np.random.default_rng(rank).standard_normal(n).astype(np.float32))
        res: dict = {}
        for fb in (True, False):
            name = f"t.fallback{int(fb)}"
            comp = gq.from_spec(spec, named_parameters=[(name, torch.nn.Parameter(torch.zeros(n)))], fallback=fb,
                                link_gbps=link)
            reduce_once(comp, name, g, hvd.Average)
            t = comp.stats()["tensors"][name]
            res[str(fb)] = {"pattern": t["pattern"], "why": t["why"], "figures": [list(r) for r in comp._figures[""].ns]}
        res["alone"] = alone(spec, n, rank, size, L, link)
        return res


check("fallback", fallback_case)


def nonfinite_case() -> str:
    """nonfinite=raise: NaN on one rank stops every rank with the error, and nobody waits."""
    name = "t.nan"
    comp = gq.from_spec("orq:levels=5,nonfinite=raise", named_parameters=[(name, torch.nn.Parameter(torch.zeros(3000)))],
                        pattern="hierarchical")
    g = torch.ones(3000)
    if rank == size - 1:
        g[2999] = float("nan")
    try:
        reduce_once(comp, name, g, hvd.Sum)
    except hvd_gradq.NonFiniteError as e:
        # the next reduction still works: the failed one left no collective half-joined
        t = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.nan")
        return f"raised:{int(t.item())}:{'non-finite' in str(e)}"
    return "no error"


check("nonfinite", nonfinite_case)


def range_case() -> dict:
    """A finite value the scheme cannot quantize (2e38, beyond ORQ's 2**127) on the last rank:
    the owner of that piece cannot encode its host's sum, sends a poison saying why and naming
    itself (passed on by the cross phases and the last phase's flag), and every rank raises a
    RangeError naming the tensor and that rank; nobody waits."""
    name = "t.range"
    comp = gq.from_spec("orq:levels=5", named_parameters=[(name, torch.nn.Parameter(torch.zeros(3000)))],
                        pattern="hierarchical")
    g = torch.ones(3000)
    if rank == size - 1:
        g[2999] = 2e38
    try:
        reduce_once(comp, name, g, hvd.Sum)
        error = {"type": "", "message": ""}
    except hvd_gradq.GradqError as e:
        error = {"type": type(e).__name__, "message": str(e)}
    # the next reduction still works: the failed one left no collective half-joined
    return {**error, "after": int(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.range").item())}


check("range", range_case)


def killed_case() -> None:
    """Issue 35, item 10, last (it ends the world): the last rank dies (``os._exit``: its sockets
    close as a killed process's do) right after it starts the step's last round of collectives,
    so that the round is out on every rank while the victim's part of it may be half sent: the
    moment that once aborted a survivor (SIGABRT in Gloo: a rank that failed one of several
    alltoalls of a Horovod cycle took a peer's stray part into the next one's smaller buffer;
    reproduced with 1-element tensors, whose last phase sends 8 bytes, and a rank dying mid-round).
    The model has such tensors. Every survivor must raise an error (Horovod's) within Gloo's
    timeout and live on to report it: a survivor that aborts or hangs leaves no report, and the
    launch fails. The victim exits 0, so that horovodrun does not SIGTERM the survivors before
    they are seen through; they leave by ``os._exit`` after a few seconds' watch, since Horovod's
    shutdown would wait out Gloo's timeout (180 s here) for a peer that is gone (stock Horovod's
    does the same)."""
    victim = size - 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    scale, shift = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.zeros(1))  # 1-element tensors
    named = [(f"k.{n}", p) for n, p in model.named_parameters()] + [("k.scale", scale), ("k.shift", shift)]
    hvd.broadcast_parameters(dict(named), root_rank=0)
    comp = gq.from_spec("orq:levels=5", named_parameters=named, pattern="hierarchical")
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.01), named_parameters=named,
                                   compression=comp)
    real_start = transport.HorovodTransport.start_fused

    def start_fused(self, requests, name):  # the victim's: it dies as its last round of the last step goes out
        handles = real_start(self, requests, name)
        if rank == victim and armed and any(r.last for r in requests):
            out["killed"] = {"victim": [r.name for r in requests]}
            report(rank, out)
            os._exit(0)
        return handles

    transport.HorovodTransport.start_fused = start_fused
    armed = False
    rng = np.random.default_rng(rank)
    t0 = time.monotonic()
    try:
        for step in range(3):
            armed = step == 2
            x = torch.from_numpy(rng.standard_normal((16, 64)).astype(np.float32))
            opt.zero_grad()
            ((model(x) * scale + shift) ** 2).mean().backward()
            t0 = time.monotonic()
            opt.step()
        got = {"type": "", "message": "the step ran"}
    except Exception as e:  # Horovod's error is a RuntimeError, hvd_gradq's a GradqError
        got = {"type": type(e).__name__, "message": str(e)[:300]}
    out["killed"] = {**got, "s": time.monotonic() - t0, "survivor": True}
    report(rank, out)
    time.sleep(3)  # a stray part landing in a smaller buffer aborts Gloo's device thread: the watch
    os._exit(0)


killed_case()
