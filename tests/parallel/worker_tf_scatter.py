"""hvd_gradq.tensorflow's scatter pattern under horovodrun (tests/parallel/test_tf_scatter.py).

Sections (each reports, errors as text so that one broken section does not hide the others):

* ``oracle``: for several schemes, a tape over two variables (2300 and 40x37 elements: chunks
  of uneven width at 2 and 3 ranks) for a few steps with gradients every rank can recompute
  (``c_r``). The reduced gradient is compared bit for bit with a NumPy simulation of all N ranks
  (:func:`simulate`) that re-implements the pattern's logic (chunking, rank-order sums, both
  error feedbacks, the finer re-quantization, the scaling) from scratch; it shares with the code
  under test only the codec (``reduce.codec.encode`` / ``hvd_gradq.dequantize``: the same
  payloads by construction), the seeding primitives (``stream_seed``, ``step_words``,
  ``tensor_key``) and the pattern's definitions (``chunk_bounds``, ``reduced_scheme``).
  Also: both residuals after the last step, the byte counters against ``patterns.cost``, and
  a ``warmup=1`` scheme (its first step Horovod's exact sum, no residual written).
* ``ckpt``: rank 0's ``tf.train.Checkpoint`` restored on every rank (the scatter-side residual
  has one width on every rank).
* ``scale``: scheme ``none`` over scatter against the same over gather (an exact rank-order
  sum either way), Sum/Average and pre/post scale factors: bitwise equal.
* ``keras``: ``DistributedOptimizer`` under ``model.fit`` with pattern=scatter (tiny biases
  included: chunks with no element), weights reported for the bitwise comparison across ranks.
* ``psets`` (``--pset 0,2`` at 3 ranks): a process set of two ranks (set rank != global rank
  on rank 2), against the simulation over those two ranks.
* ``auto``: what ``pattern=auto`` picks per slot equals ``patterns.decide``.
* ``propagate``: ``nonfinite=propagate``, an Inf on one rank: its bucket decodes NaN everywhere.
* ``nonfinite`` (last: it fails a step): ``nonfinite=raise`` is refused with pattern=scatter; under
  auto (gather) a NaN on rank 1 raises on
  every rank.
"""
import argparse
import os
import tempfile

import draws
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf
from harness import digest, report, sections

import hvd_gradq
import hvd_gradq.tensorflow as gq
from hvd_gradq.api import Payload
from hvd_gradq.plan.decide import cost, decide
from hvd_gradq.plan.layout import chunk_bounds
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.plan.second_phase import reduced_scheme
from hvd_gradq.reduce import codec

ap = argparse.ArgumentParser()
ap.add_argument("--only", default="")
ap.add_argument("--pset", default="", help="global ranks of a process set to test, e.g. 0,2")
args = ap.parse_args()
only = set(filter(None, args.only.split(",")))
if os.environ.get("HVDQ_DEBUG_HANG"):
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["HVDQ_DEBUG_HANG"]), exit=True)

PSET = [int(r) for r in args.pset.split(",") if r]
PS = hvd.ProcessSet(PSET) if PSET else None
hvd.init(process_sets=[PS] if PS is not None else None)
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
rank, size = hvd.rank(), hvd.size()
out: dict = {"size": size}
section = sections(only, out, rank)
SEED = 7
SHAPES = {"a": (2300,), "b": (40, 37)}
STEPS = 3
SCHEMES = ["orq:levels=5", "orq:levels=3,ef=true", "qsgd:levels=4", "bingrad", "uniform:bits=4", "terngrad", "none",
           "qsgd:levels=4,ef=true,warmup=1"]


def grad_of(r, step, shape):
    """Rank r's gradient at ``step``: what every rank can recompute (the loss is sum(w * c))."""
    rng = np.random.default_rng([r, step, int(np.prod(shape))])
    return (rng.standard_normal(shape) * (1.0 + r)).astype(np.float32)


# -- the oracle: every rank of the group simulated in NumPy ---------------------------------------
def _decode(buf):
    return hvd_gradq.dequantize(Payload.from_bytes(buf)).astype(np.float32).reshape(-1)


def horovod_one(ps):
    """What Horovod's Average allreduce makes of the compressor's [1.0] (in a graph, as Horovod
    runs it): ``v`` for :func:`scaled`."""
    kw = {"process_set": ps} if ps is not None else {}
    return tf.function(lambda: hvd.allreduce(tf.ones((1,)), op=hvd.Average, name=f"one{ps is not None}", **kw))(
        ).numpy()[0]


def scaled(total, v, n):
    """The frontends' final scaling by Horovod's v (GradqCompressor.decompress's rule, as gather does)."""
    n = np.float32(n)
    return total / n if v == 1.0 else total if v == n else total * (np.float32(v) / n)


def simulate(spec, members, slot_index, grads, state, step, v):
    """One step of the scatter pattern over ``members`` (global ranks, in set order): ``grads[i]``
    the flat gradient of member i; ``state`` holds every member's residual (``e``) and every
    chunk's scatter-side residual (``s``); ``v`` Horovod's reduced [1.0]. Returns the reduced
    flat gradient."""
    config = hvd_gradq.parse(spec)
    scheme, policy = config.scheme, config.policy
    n, N = grads[0].size, len(members)
    bounds = chunk_bounds(n, scheme.bucket, N)
    fine = reduced_scheme(scheme, N)

    def words(i, tag):
        a, b = draws.words(SEED, members[i], f"{slot_index}{tag}", step)  # TF's key: the slot's index
        return (np.int64(a), np.int64(b))

    sent = {}  # (member, chunk) -> payload bytes
    for i in range(N):
        x = grads[i]
        if policy.ef:
            x = x + state.setdefault(("e", i), np.zeros(n, np.float32))
        own = []
        for j, (lo, hi) in enumerate(bounds):
            buf, dec = codec.encode(scheme, x[lo:hi], words(i, f"#{j}"), "oracle")
            sent[i, j] = buf
            own.append(dec)
        if policy.ef:
            e = x - np.concatenate(own)
            state["e", i] = np.where(np.isfinite(e), e, state["e", i])
    reduced = []
    for j, (lo, hi) in enumerate(bounds):
        part = None
        for i in range(N):  # rank order
            d = _decode(sent[i, j])
            part = d.copy() if part is None else part + d
        if policy.ef:
            part = part + state.setdefault(("s", j), np.zeros(hi - lo, np.float32))
        buf, dec = codec.encode(fine, part, words(j, "#reduce"), "oracle")
        if policy.ef:
            s = part - dec
            state["s", j] = np.where(np.isfinite(s), s, state["s", j])
        reduced.append(_decode(buf))
    return scaled(np.concatenate(reduced), v, N)


def make(spec, ps, name):
    """A compressor (pattern=scatter) and a tape step over two variables wa, wb whose gradients
    are the step's inputs ``cs``."""
    kw = {"process_set": ps} if ps is not None else {}
    comp = gq.from_spec(spec, pattern="scatter", name=name, seed=SEED, **kw)
    ws = {k: tf.Variable(tf.zeros(s), name=f"w{k}") for k, s in SHAPES.items()}

    @tf.function
    def step(cs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(ws[k] * cs[k]) for k in SHAPES])
        tape = hvd.DistributedGradientTape(tape, compression=comp, **kw)
        return dict(zip(SHAPES, tape.gradient(loss, [ws[k] for k in SHAPES])))

    return comp, step


def var_step(comp, w):
    """A tape step over one variable ``w`` whose gradient is the input ``c``."""
    @tf.function
    def step(c):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        return hvd.DistributedGradientTape(tape, compression=comp).gradient(loss, [w])[0]
    return step


def inputs(t):
    return {k: tf.constant(grad_of(rank, t, s)) for k, s in SHAPES.items()}


def tape_case(spec, members, ps, name):
    """Train two variables for STEPS steps; compare each step's reduced gradients and, at the
    end, both residuals with the simulation. Warm-up steps (``warmup=K``: Horovod's exact fp32
    sum, its own order) are compared with the mean within the bound of any summation order,
    |error| <= N * eps * sum|c_r| / N (+ the division's half ulp); they write no residual."""
    comp, step = make(spec, ps, name)
    me = members.index(rank)
    config = hvd_gradq.parse(spec)
    scheme, policy = config.scheme, config.policy
    states = {k: {} for k in SHAPES}
    v = horovod_one(ps)
    equal, digests = [], []
    for t in range(STEPS):
        got = step(inputs(t))
        slots = {s["key"]: s for s in comp.slots()}
        for k, shape in SHAPES.items():
            idx = slots[f"w{k}:0"]["index"]
            cs = [grad_of(r, t, shape).reshape(-1) for r in members]
            g = got[k].numpy().reshape(-1)
            if t < policy.warmup:
                mean = np.sum(np.array(cs, np.float64), axis=0) / len(members)
                bound = (len(members) + 1) * np.finfo(np.float32).eps * np.sum(np.abs(cs), axis=0) / len(members)
                equal.append(bool(np.all(np.abs(g - mean) <= bound)))
                digests.append(digest([g]))
                continue
            want = simulate(spec, members, idx, cs, states[k], t, v)
            equal.append(bool(np.array_equal(g, want)))
            if not equal[-1]:
                diff = np.abs(g - want) / np.maximum(np.abs(want), 1e-30)
                print(f"[{rank}] {spec} {k} step {t}: {int((g != want).sum())} differ, rel {float(diff.max()):.3g}",
                      flush=True)
            digests.append(digest([g]))
    res = {"equal": equal, "digest": digest(digests), "patterns": sorted({s["pattern"] for s in comp.slots()})}
    if policy.ef:
        ok = []
        for k, shape in SHAPES.items():
            n = int(np.prod(shape))
            lo, hi = chunk_bounds(n, scheme.bucket, len(members))[me]
            e = comp.residuals[f"w{k}:0"].numpy()
            s = comp.residuals[f"w{k}:0#reduce"].numpy()
            widest = max(b - a for a, b in chunk_bounds(n, scheme.bucket, len(members)))
            ok += [np.array_equal(e, states[k]["e", me]), np.array_equal(s[: hi - lo], states[k]["s", me]),
                   s.shape == (widest,) and not s[hi - lo:].any(), bool(np.abs(s).max() > 0)]
        res["residuals_equal"] = [bool(v) for v in ok]
    st = comp.stats()["total"]
    model = [cost(scheme, int(np.prod(s)), len(s), len(members), Pattern.SCATTER) for s in SHAPES.values()]
    res["bytes"] = [st["scatter"]["sent"], st["scatter"]["received"]]
    res["bytes_model"] = [STEPS * sum(c.sent for c in model), STEPS * sum(c.received for c in model)]
    res["slot_bytes_ok"] = all((s["sent"], s["received"]) == (c.sent, c.received)
                               for s, c in zip(sorted(comp.slots(), key=lambda s: s["key"]), model))
    return res


@section("oracle")
def _oracle():
    return {spec: tape_case(spec, list(range(size)), None, f"or{i}") for i, spec in enumerate(SCHEMES)}


@section("psets")
def _psets():
    if PS is None:
        return {"skipped": True}
    try:
        if rank not in PSET:
            return {"member": False}
        return {spec: tape_case(spec, PSET, PS, f"ps{i}")
                for i, spec in enumerate(["orq:levels=3,ef=true", "bingrad", "none"])}
    finally:  # a rank outside the set waits here: a rank that ends its run shuts Horovod down for all
        hvd.allreduce(tf.constant(0.0), name="psets.barrier")


@section("ckpt")
def _ckpt():
    """Rank 0's checkpoint restores on every rank: the scatter-side residuals have one width
    everywhere (the widest chunk), though the chunks do not at 3 ranks."""
    spec = "orq:levels=3,ef=true"
    comp, step = make(spec, None, "ck")
    for t in range(2):
        step(inputs(t))
    base = os.path.join(os.environ.get("HVD_GRADQ_TEST_OUT") or tempfile.mkdtemp(), "ck")  # shared by the ranks
    if rank == 0:
        tf.train.Checkpoint(compressor=comp).write(base)
    hvd.allreduce(tf.constant(0.0), name="ck.barrier")  # rank 0's file exists before anyone reads it
    comp2, step2 = make(spec, None, "ck2")
    status = tf.train.Checkpoint(compressor=comp2).read(base)
    step2.get_concrete_function(inputs(2))  # the trace creates the slots: restored on creation
    status.assert_existing_objects_matched()
    res = {"saved": digest(comp.residuals[k].numpy() for k in sorted(comp.residuals)),
           "restored": digest(comp2.residuals[k].numpy() for k in sorted(comp2.residuals)),
           "keys": sorted(comp2.residuals), "owners": sorted({int(o.numpy()) for o in comp2.owners.values()})}
    g = step2(inputs(2))
    res["finite"] = all(bool(np.isfinite(a.numpy()).all()) for a in g.values())
    res["owners_after"] = sorted({int(o.numpy()) for o in comp2.owners.values()})
    return res


@section("scale")
def _scale():
    res = {}
    t = tf.constant(grad_of(rank, 9, (33, 70)))
    k = 0
    for op_name, op in (("sum", hvd.Sum), ("avg", hvd.Average)):
        for pre, post in ((1.0, 1.0), (0.25, 1.0), (0.5, 3.0)):
            vals = {}
            for pat in ("gather", "scatter"):
                k += 1
                comp = gq.NoCompression(pattern=pat, name=f"sc{k}")

                @tf.function
                def red(t, comp=comp, op=op, pre=pre, post=post, k=k):
                    return hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, compression=comp,
                                         name=f"sc.r{k}")
                vals[pat] = red(t).numpy()
            eager = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, name=f"sc.e{k}",
                                  compression=gq.NoCompression(pattern="scatter", name=f"sce{k}")).numpy()
            res[f"{op_name} pre={pre} post={post}"] = {
                "equal": bool(np.array_equal(vals["gather"], vals["scatter"])),
                "eager_equal": bool(np.array_equal(vals["gather"], eager))}
    return res


@section("keras")
def _keras():
    res = {}
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((64, 30)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    for i, spec in enumerate(["orq:levels=3,ef=true", "bingrad", "qsgd:levels=4"]):
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((30,)), tf.keras.layers.Dense(40, activation="tanh"),
                                     tf.keras.layers.Dense(3)])
        comp = gq.from_spec(spec, pattern="scatter", name=f"k{i}")
        model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=comp),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        res[spec] = {"loss": [float(v) for v in hist.history["loss"]], "weights": digest(model.get_weights()),
                     "patterns": sorted({s["pattern"] for s in comp.slots()}),
                     "steps": sorted({s["steps"] for s in comp.slots()}),
                     "residuals": sorted(comp.residuals)}
    return res


@section("auto")
def _auto():
    res = {}
    for i, spec in enumerate(["uniform:bits=4", "sign", "orq:levels=5"]):
        comp = gq.from_spec(spec, name=f"au{i}")
        step = var_step(comp, tf.Variable(tf.zeros((300, 200)), name=f"au{i}"))
        g = step(tf.constant(grad_of(rank, 0, (300, 200)))).numpy()
        want = decide(hvd_gradq.parse(spec), 60000, 2, size, Pattern.AUTO, fallback=comp.fallback,
                      figures=comp._figures[0]).pattern.value  # the compressor's fallback and agreed CPU figures
        res[spec] = {"picked": comp.slots()[0]["pattern"], "decide": want, "digest": digest([g]),
                     "finite": bool(np.isfinite(g).all())}
    return res


@section("propagate")
def _propagate():
    """nonfinite=propagate: an Inf on rank 1 at element 700 makes its bucket [512, 1024) NaN on
    every rank, nothing else; both residuals stay finite; the next step is finite again."""
    res = {}
    for spec in ("orq:levels=5,ef=true", "uniform:bits=4,ef=true", "none"):
        comp = gq.from_spec(spec, pattern="scatter", name=f"pr{len(res)}")
        step = var_step(comp, tf.Variable(tf.zeros((2300,)), name=f"wp{len(res)}"))
        step(tf.constant(grad_of(rank, 0, (2300,))))
        c = grad_of(rank, 1, (2300,))
        if rank == 1:
            c[700] = np.inf
        g = step(tf.constant(c)).numpy()
        bad = ~np.isfinite(g)
        res[spec] = {"bad": [int(i) for i in np.flatnonzero(bad)[[0, -1]]] if bad.any() else [],
                     "bad_count": int(bad.sum()),
                     "residuals_finite": all(bool(np.isfinite(r.numpy()).all()) for r in comp.residuals.values()),
                     "recovered": bool(np.isfinite(step(tf.constant(grad_of(rank, 2, (2300,))))).all())}
    return res


@section("nonfinite")
def _nonfinite():
    """``nonfinite=raise`` is refused with pattern=scatter (its phase 2 starts in decompress(),
    after a decode that may stop the step); under auto it takes gather and every rank raises."""
    try:
        gq.from_spec("orq:levels=5,nonfinite=raise,ef=true", pattern="scatter", name="nf0")
        refused = "accepted"
    except hvd_gradq.GradqError as e:
        refused = str(e)
    comp = gq.from_spec("orq:levels=5,nonfinite=raise,ef=true", name="nf")
    step = var_step(comp, tf.Variable(tf.zeros((2300,)), name="wnf"))
    step(tf.constant(grad_of(rank, 0, (2300,))))
    c = grad_of(rank, 1, (2300,))
    if rank == 1:
        c[1800] = np.nan
    try:
        step(tf.constant(c))
        return {"error_text": "no error", "refused": refused}
    except Exception as e:  # TF wraps it (InvalidArgumentError); the message is hvd_gradq's
        text = f"{type(e).__name__}: {e}"  # TF puts the traced graph's call stack first, our message last
        return {"error_text": text if len(text) <= 2000 else text[:400] + " ... " + text[-1600:], "refused": refused,
                "patterns": [s["pattern"] for s in comp.slots()]}


report(rank, out)
