"""Every scheme, with and without error feedback, in one launch: 100 steps of a small CNN under
stock hvd.DistributedOptimizer; per scheme, a digest of the weights and the eval loss every 10
steps; then the oracle check (decoded mean gradient == the NumPy oracle's decode of every rank's
payload), stats at this world size, and the parameter-identity check.

The runs with ``op=hvd.Sum`` and with ``num_groups`` (labels with ``|``) are probed at every step:
each rank's own gradient is recomputed on the side, allgathered, and the gradient Horovod left in
``p.grad`` must be the oracle's reduction of them (the sum for Sum, the sum / N for Average)."""

import argparse
import contextlib
import hashlib
import io
import os

import draws
import horovod.torch as hvd
import numpy as np
import torch
from harness import report

import hvd_gradq
import hvd_gradq.torch as gq
from hvd_gradq import kernels
from hvd_gradq.plan.decide import decide
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.schemes.summable import decode_codes, encode_shared, local_stats
from hvd_gradq.xp import NUMPY

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--schemes", default="")
ap.add_argument("--skip-identity", action="store_true")
# shifts the model's init, the data and the rounding noise (0: the suite's run); for measuring
# how the final losses spread across seeds when setting the tolerances in test_torch.py
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

SCHEMES = [
    "none",
    "fp16",
    "uniform:bits=8",
    "uniform:bits=4",
    "qsgd:levels=4",
    "terngrad",
    "sign",
    "topk:ratio=0.05",
    "bingrad:ef=false",  # BinGrad's default is ef=true; the +ef rows below turn it on
    "bingrad:variant=pb,ef=false",
    "orq:levels=3",
    "orq:levels=5",
    "orq:levels=9",
]
if args.schemes:
    SCHEMES = args.schemes.split(";")

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()


def make_model() -> torch.nn.Module:
    torch.manual_seed(args.seed)
    return torch.nn.Sequential(
        torch.nn.Conv1d(1, 8, 5, padding=2),
        torch.nn.ReLU(),
        torch.nn.MaxPool1d(2),
        torch.nn.Conv1d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 20, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


# a learnable synthetic task: class = which quarter of the signal holds a bump
data_rng = np.random.default_rng(1234)


def batch(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    y = rng.integers(0, 4, n)
    x = rng.standard_normal((n, 1, 40)).astype(np.float32) * 0.5
    for i, c in enumerate(y):
        x[i, 0, c * 10 + 3 : c * 10 + 7] += 2.0
    return torch.from_numpy(x), torch.from_numpy(y)


xe, ye = batch(np.random.default_rng(999), 512)
# the run whose telemetry is reported: stats(), metrics() and its first-step log line (stderr)
TELEMETRY = "orq:levels=5"


def train(spec: str, steps: int, probe: bool = False, **opt_kw):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    comp = (
        hvd.Compression.none
        if spec == "stock"
        else gq.from_spec(spec, named_parameters=model.named_parameters(), seed=7 + args.seed,
                          log_every=10 if spec == TELEMETRY else 0)  # the telemetry run: a line every 10 steps
    )
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=comp, **opt_kw)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    rng = np.random.default_rng(100 + rank + 1000 * args.seed)
    with torch.no_grad():
        loss0 = float(torch.nn.functional.cross_entropy(model(xe), ye))
    curve = []  # eval loss every 10 steps
    named = list(model.named_parameters())
    probes = []
    log_text = io.StringIO()
    for step in range(steps):
        x, y = batch(rng, 32)
        if probe:  # this rank's own gradient, on the side: autograd.grad runs no hook and leaves .grad alone
            local = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), [p for _, p in named])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with contextlib.redirect_stderr(log_text) if spec == TELEMETRY else contextlib.nullcontext():
            opt.step()  # a step ends at its last decompress(), inside step()
        if probe:  # after step(), p.grad holds what Horovod's reduction and decompress() returned
            probes.append(probe_step(comp, named, local, step, opt_kw.get("op", hvd.Average)))
        if step % 10 == 9:
            with torch.no_grad():
                curve.append(float(torch.nn.functional.cross_entropy(model(xe), ye)))
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(model(xe), ye))
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    st = comp.stats() if hasattr(comp, "stats") else None
    out = {"digest": h.hexdigest(), "loss0": loss0, "loss": loss, "curve": curve, "stats": st}
    if spec == TELEMETRY:
        choices = {name: decide(comp.scheme, p.numel(), p.dim(), size, Pattern.AUTO, local=1,
                                link_gbps=comp.link_gbps, fallback=comp.fallback, figures=comp._figures[""])
                   for name, p in named}  # as the compressor decides: its fallback, the ranks' agreed CPU figures
        decided = {name: (c.pattern, c.why) for name, c in choices.items()}
        out["telemetry"] = {"stderr": log_text.getvalue(), "metrics": comp.metrics(), "summary": comp.summary(),
                            "decided": {k: [p.value, why] for k, (p, why) in decided.items()}}
    if probe:
        out["probe"] = {
            "bad": [b for p in probes for b in p["bad"]],
            "patterns": sorted({u for p in probes for u in p["patterns"]}),
            "steps": len(probes),
        }
    return out


def probe_step(comp, named, local, step: int, op) -> dict:
    """One step of a probed run: for every parameter, the gradient ``DistributedOptimizer`` left
    in ``p.grad`` against the oracle's reduction of every rank's own gradient (``local``)."""
    bad, patterns = [], set()
    for (name, p), g in zip(named, local):
        allx = hvd.allgather(g.detach().reshape(1, -1), name=f"probe.{name}").numpy()
        out = p.grad.detach().reshape(-1).numpy()
        # the pattern the frontend used for this tensor this step (which collective, not values)
        used = comp.stats()["tensors"][name]["pattern"]
        patterns.add(used)
        if used == "fp32":  # too small to compress: Horovod's own fp32 allreduce, in its own order
            total = allx.astype(np.float64).sum(0)
            want = total if op == hvd.Sum else total / size
            ok = bool(np.allclose(out, want, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(want).max()))))
        else:
            with kernels.disabled():  # the NumPy reference: no code shared with the compiled paths
                total = reference(comp.scheme, used, allx, comp.seed, step, name)
            want = total if op == hvd.Sum else total / size
            ok = bool(np.array_equal(out, want.astype(np.float32)))
        if not ok:
            bad.append(f"step {step} {name} ({used}): max |diff| {float(np.abs(out - want).max()):.3g}")
    return {"bad": bad, "patterns": sorted(patterns)}


def finer(scheme, nranks: int):
    """The reduced chunk's scheme, restated from the rule (plan/second_phase.py): stochastic
    rounding on 2**b evenly spaced levels of each bucket, b the fewest bits with 2**b - 1 >=
    1.85 (s - 1) for a first phase of s levels (ORQ-s: s, uniform: 2**bits, QSGD-q: 2q + 1), at
    most 8, with the scheme's bucket, clip and scales; schemes without a finer form (uniform-8
    included) keep their own."""
    levels = {"orq": lambda: scheme.levels, "qsgd": lambda: 2 * scheme.levels + 1,
              "uniform": lambda: 2 ** scheme.bits}.get(scheme.name)
    if nranks <= 1 or levels is None or (scheme.name == "uniform" and scheme.bits == 8):
        return scheme
    b = 1
    while 2 ** b - 1 < 1.85 * (levels() - 1) and b < 8:
        b += 1
    return hvd_gradq.parse(f"uniform:bits={b},rounding=stochastic,bucket={scheme.bucket},clip={scheme.clip},"
                           f"scales={scheme.scales.value}").scheme


def reference(scheme, used: str, allx: np.ndarray, base: int, step: int, name: str) -> np.ndarray:
    """The decoded *sum* every rank must hold for pattern ``used`` (the frontend divides it by N
    for op=Average), from every rank's input (rank order), compressor seed ``base``, the
    tensor's step counter and name."""
    n = allx.shape[1]
    if used == "scatter":
        from hvd_gradq.plan.layout import chunk_bounds

        pieces = []
        for j, (lo, hi) in enumerate(chunk_bounds(n, scheme.bucket, size)):
            part = None
            for r in range(size):
                q = hvd_gradq.quantize(allx[r][lo:hi], scheme, seed=draws.words(base, r, f"{name}#{j}", step))
                d = hvd_gradq.dequantize(q)
                part = d if part is None else part + d
            red = hvd_gradq.quantize(part, finer(scheme, size), seed=draws.words(base, j, f"{name}#reduce", step))
            pieces.append(hvd_gradq.dequantize(red))
        return np.concatenate(pieces)
    if used == "gather":
        total = None
        for r in range(size):
            seed = draws.words(base, r, name, step)
            d = hvd_gradq.dequantize(
                hvd_gradq.Payload.from_bytes(hvd_gradq.quantize(allx[r], scheme, seed=seed).to_bytes())
            )
            total = d if total is None else total + d
        return total
    assert used == "summable", used
    stats = np.max([local_stats(scheme, NUMPY, allx[r]) for r in range(size)], axis=0)
    codes = sum(
        encode_shared(scheme, NUMPY, allx[r], stats, draws.words(base, r, name, step))[0] for r in range(size)
    )
    meta = encode_shared(scheme, NUMPY, allx[0], stats, 0)[1]
    return decode_codes(scheme, NUMPY, codes, meta, n, count=size)


results = {}
def with_ef(s: str) -> str:
    if "ef=false" in s:
        return s.replace("ef=false", "ef=true")
    return s + ",ef=true" if ":" in s else s + ":ef=true"


for spec in ["stock"] + SCHEMES + [with_ef(s) for s in SCHEMES if s != "none"]:
    try:
        results[spec] = train(spec, args.steps)
    except hvd_gradq.NonFiniteError as e:  # every rank sees the same decoded gradient, so all stop here
        results[spec] = {"digest": "", "loss0": 0.0, "loss": float("inf"), "stats": None, "error": str(e)}
# grouped allreduce and a Sum op, once each, every step's reduced gradients against the oracle
results["orq:levels=5|num_groups=2"] = train("orq:levels=5", 10, probe=True, num_groups=2)
results["qsgd|op=Sum"] = train("qsgd:levels=4", 10, probe=True, op=hvd.Sum)


# -- fusion: the small tensors' gathers in the round's one collective give the bits of each alone
def fused_check(spec: str) -> dict:
    from hvd_gradq.torch import reduce as driver
    from hvd_gradq.torch import transport

    real = transport.HorovodTransport.start_fused
    fused: list[int] = []

    def counting(self, requests, name):
        fused.append(sum(type(r).__name__ == "Allgather" for r in requests))
        return real(self, requests, name)

    transport.HorovodTransport.start_fused = counting
    try:
        on = train(spec, 10)
        count = sum(fused)
        os.environ[driver.FUSE_ENV] = "0"  # read when a compressor's driver is made
        try:
            off = train(spec, 10)
        finally:
            del os.environ[driver.FUSE_ENV]
    finally:
        transport.HorovodTransport.start_fused = real
    return {"same": on["digest"] == off["digest"], "fused_gathers": count, "fused_off": sum(fused) - count}


# pattern=gather: auto may weigh gather against scatter by timings, which two trainings need not share
fusion = {spec: fused_check(spec + ",pattern=gather") for spec in ("orq:levels=5", "sign:ef=true")}


# -- error feedback inside the encode: the bits of compensating, encoding, decoding and keeping the
# residual one after the other, here run by the NumPy reference (the kernels off), which shares
# no code with the fused kernels
def fed_check(spec: str) -> dict:
    from hvd_gradq import kernels

    real = kernels.encode_fed
    fed: list[int] = []

    def counting(*a, **kw):
        got = real(*a, **kw)
        fed.append(got is not None)
        return got

    kernels.encode_fed = counting
    try:
        on = train(spec, 10)
        fed_on, calls_on = sum(fed), len(fed)
        with kernels.disabled():
            off = train(spec, 10)
    finally:
        kernels.encode_fed = real
    return {"same": on["digest"] == off["digest"], "fed": fed_on, "calls": calls_on, "fed_off": sum(fed) - fed_on,
            "loss": [on["loss"], off["loss"]]}


fed = {spec: fed_check(spec) for spec in ("orq:levels=5,ef=true,pattern=gather", "bingrad:pattern=scatter",
                                          "uniform:bits=4,ef=true,pattern=gather,clip=2")}


# -- oracle: the decoded mean (or sum) equals the NumPy oracle's decode of all ranks' payloads
def oracle_check(spec: str, pattern: str, op=hvd.Average) -> tuple[bool, str]:
    p = torch.nn.Parameter(torch.zeros(1000))
    comp = gq.from_spec(spec, named_parameters=[("w", p)], seed=3, pattern=pattern)
    g = torch.from_numpy(np.random.default_rng(rank).standard_t(3, 1000).astype(np.float32))
    g._hvd_gradq_name = "w"
    dummy, ctx = comp.compress(g)
    dummy = hvd.allreduce(dummy, op=op, name=f"oracle.dummy.{spec}.{pattern}.{int(op)}")
    out = comp.decompress(dummy, ctx).numpy()
    allx = hvd.allgather(g[None], name=f"oracle.x.{spec}.{pattern}").numpy()
    scheme = hvd_gradq.parse(spec).scheme  # one step: no residual yet, the maths alone
    used = ctx.pattern.value
    # The frontend above ran the compiled kernels; the oracle runs the NumPy reference (kernels
    # off), so a kernel bug cannot appear on both sides and cancel out.
    with kernels.disabled():
        total = reference(scheme, used, allx, 3, 0, "w")
    ref = total if op == hvd.Sum else total / size
    return bool(np.array_equal(out, ref.astype(np.float32))), used


oracle = {}
for spec in ["orq:levels=5", "bingrad:ef=false", "topk:ratio=0.1", "sign"]:
    oracle[spec] = oracle_check(spec, "gather")
for spec in ["orq:levels=5", "sign:ef=true", "qsgd:levels=4"]:
    oracle[spec + "|scatter"] = oracle_check(spec, "scatter")
for spec in ["qsgd:levels=4", "uniform:bits=4", "terngrad"]:
    oracle[spec + "|summable"] = oracle_check(spec, "summable")
    oracle[spec + "|gather"] = oracle_check(spec, "gather")
# op=Sum: the decoded sum itself, N times the Average (each pattern; the probed run covers the optimizer)
for pattern in ("gather", "summable", "scatter"):
    oracle[f"qsgd:levels=4|{pattern}|Sum"] = oracle_check("qsgd:levels=4", pattern, op=hvd.Sum)


# -- identity: two same-shape parameters, different gradients, separate EF residuals
def identity_check(bpps: int) -> dict:
    a = torch.nn.Parameter(torch.zeros(600))
    b = torch.nn.Parameter(torch.zeros(600))
    ca = torch.linspace(-1, 1, 600)
    cb = torch.linspace(2, -3, 600) ** 3
    named = [("a", a), ("b", b)]
    comp = gq.from_spec("sign:ef=true", named_parameters=named, seed=1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([a, b], lr=0.0), named_parameters=named, compression=comp, backward_passes_per_step=bpps
    )
    for _ in range(3):
        opt.zero_grad()
        for _ in range(bpps):
            ((a * ca).sum() + (b * cb).sum()).backward()
        opt.step()
    # simulate each parameter's EF on its own with the NumPy oracle
    ok = {}
    for name, c in (("a", ca), ("b", cb)):
        e = np.zeros(600, np.float32)
        for step in range(3):
            pvec = (c.numpy() * bpps).astype(np.float32) + e
            d = hvd_gradq.dequantize(
                hvd_gradq.quantize(pvec, "sign:ef=true", seed=draws.words(1, rank, name, step))
            )
            e = pvec - d
        ok[name] = bool(np.array_equal(comp.state_dict()["residuals"][name].numpy(), e))
    ra, rb = comp.state_dict()["residuals"]["a"], comp.state_dict()["residuals"]["b"]
    ok["distinct"] = not torch.equal(ra, rb)
    return ok


identity = {} if args.skip_identity else {"bpps1": identity_check(1), "bpps2": identity_check(2)}
report(rank, {"results": results, "oracle": oracle, "identity": identity, "size": size, "kernels": kernels.available(),
              "fusion": fusion, "fed": fed})
