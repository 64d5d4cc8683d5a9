"""hvd_gradq.tensorflow wherever stock Horovod trains: Adasum refused, pre/post scale factors,
process sets, state keyed by variable (freeze/unfreeze, recompile), dynamic shapes
(``sparse_as_dense``), ``nonfinite=propagate`` for every scheme and pattern, loss scaling,
checkpoints restored on another rank, elastic mode refused.

Each section reports what the launching test (tests/parallel/test_tf.py) checks; ``--only``
runs a comma-separated subset. Errors inside a section are reported as text, not raised, so
one broken section does not hide the others.
"""
import argparse
import os
import tempfile

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf
from harness import digest, report, sections

import hvd_gradq.tensorflow as gq
from hvd_gradq.errors import GradqError

ap = argparse.ArgumentParser()
ap.add_argument("--only", default="")
args = ap.parse_args()
if os.environ.get("HVDQ_DEBUG_HANG"):  # print every thread's stack if the run outlives it
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["HVDQ_DEBUG_HANG"]), exit=True)
only = set(filter(None, args.only.split(",")))

PS0, PS1 = hvd.ProcessSet([0]), hvd.ProcessSet([1])
hvd.init(process_sets=[PS0, PS1])
PSB = hvd.global_process_set  # both ranks (at 2 ranks a set [0, 1] would duplicate it)
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
rank, size = hvd.rank(), hvd.size()
out: dict = {"size": size}
section = sections(only, out, rank)  # run a section if wanted; record its result or its error text


def err_text(f, limit=2000) -> str:
    try:
        f()
        return "no error"
    except Exception as e:  # AutoGraph may wrap it: the message is what counts
        return f"{type(e).__name__}: {e}"[:limit]


def dense_model(width=8, n_in=8, seed=0):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((n_in,)), tf.keras.layers.Dense(width, activation="tanh"),
                                tf.keras.layers.Dense(width), tf.keras.layers.Dense(3)])


def data(step, n_in=8, batch=16):
    rng = np.random.default_rng(1000 * step + rank)
    return (tf.constant(rng.standard_normal((batch, n_in)).astype(np.float32)),
            tf.constant(rng.integers(0, 3, batch)))


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def tape_step(model, opt, comp, **tape_kw):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=comp, **tape_kw)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return grads
    return step


# -- 1. Adasum is refused on every rank, without hanging ------------------------------------------
@section("adasum")
def _adasum():
    res = {}
    model = dense_model()
    res["tape"] = err_text(lambda: tape_step(model, tf.keras.optimizers.SGD(0.1), gq.QSGD(name="ad1"),
                                             op=hvd.Adasum)(*data(0)))
    x, y = data(0)

    def keras():  # Horovod's Keras optimizer refuses Adasum itself; if it did not, the compressor would
        model = dense_model()
        opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=gq.QSGD(name="ad2"), op=hvd.Adasum)
        model.compile(opt, LOSS)
        model.fit(x, y, epochs=1, verbose=0)
    res["keras"] = err_text(keras)
    res["allreduce"] = err_text(lambda: hvd.allreduce(x, op=hvd.Adasum, compression=gq.QSGD(name="ad3"),
                                                      name="adasum.eager"))
    # still alive and in step: a plain collective after the refusals
    res["after"] = float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="adasum.after"))
    return res


# -- 2. prescale / postscale factors, against stock Horovod ----------------------------------------
@section("scale")
def _scale():
    res = {}
    rng = np.random.default_rng(rank)
    t = tf.constant(rng.standard_normal((40, 30)).astype(np.float32))
    k = 0
    for op_name, op in (("sum", hvd.Sum), ("avg", hvd.Average)):
        for pre, post in ((0.25, 1.0), (1.0, 3.0), (0.5, 2.0), (1.0, 1.0)):
            k += 1
            stock = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, name=f"sc.stock{k}").numpy()
            comp = gq.NoCompression(pattern="gather", name=f"sc{k}")
            ours = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, compression=comp,
                                 name=f"sc.ours{k}").numpy()

            @tf.function
            def graph(t, comp=comp, op=op, pre=pre, post=post, k=k):
                return hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post, compression=comp,
                                     name=f"sc.graph{k}")
            g = graph(t).numpy()
            res[f"{op_name} pre={pre} post={post}"] = {
                "eager_rel": float(np.abs(ours - stock).max() / np.abs(stock).max()),
                "graph_rel": float(np.abs(g - stock).max() / np.abs(stock).max())}
    # the tape's gradient_predivide_factor (pre 1/f, post f with Average)
    grads = {}
    for label, comp in (("stock", hvd.Compression.none), ("ours", gq.NoCompression(pattern="gather", name="scp"))):
        model = dense_model(width=24)
        grads[label] = [g.numpy() for g in tape_step(model, tf.keras.optimizers.SGD(0.0), comp,
                                                     gradient_predivide_factor=4.0)(*data(1))]
    res["predivide_rel"] = max(float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30))
                               for a, b in zip(grads["stock"], grads["ours"]))
    return res


# -- 3. process sets ------------------------------------------------------------------------------
@section("psets")
def _psets():
    res = {}
    x, y = data(2)
    # both ranks, named explicitly: compressed over it, as stock does
    grads = {}
    for label, comp in (("stock", hvd.Compression.none), ("ours", gq.NoCompression(pattern="gather", name="psb")),
                        ("orq", gq.ORQ(levels=5, ef=True, name="psb2"))):
        model = dense_model(width=24)
        grads[label] = [a.numpy() for a in tape_step(model, tf.keras.optimizers.SGD(0.1), comp, process_set=PSB)(x, y)]
        res[f"both_{label}_digest"] = digest(v.numpy() for v in model.trainable_variables)
    res["both_rel"] = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(grads["stock"], grads["ours"]))
    res["orq_rel"] = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(grads["stock"], grads["orq"]))
    # Keras, over the two-rank set
    model = dense_model(width=24)
    model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=gq.QSGD(ef=True, name="psk"),
                                            process_set=PSB), LOSS)
    model.fit(x, y, epochs=2, verbose=0)
    res["keras_digest"] = digest(v.numpy() for v in model.trainable_variables)
    # a set of one rank: rank 0 reduces over [0] alone (rank 1 takes no part: nothing to wait for)
    if rank == 0:
        comp = gq.QSGD(name="ps0")
        model = dense_model(width=24)
        g = tape_step(model, tf.keras.optimizers.SGD(0.1), comp, process_set=PS0)(x, y)
        res["single_eager"] = float(np.abs(hvd.allreduce(x, process_set=PS0, compression=gq.QSGD(name="ps0e"),
                                                         name="ps0.eager").numpy() - x.numpy()).max())
        res["single_ok"] = all(np.isfinite(a.numpy()).all() for a in g)
    # each rank in its own set, at once
    mine = PS0 if rank == 0 else PS1
    model = dense_model(width=24)
    g = tape_step(model, tf.keras.optimizers.SGD(0.1), gq.ORQ(levels=3, ef=True, name="psown"), process_set=mine)(x, y)
    res["own_set_finite"] = all(np.isfinite(a.numpy()).all() for a in g)
    # a constructor's process set that disagrees with Horovod's is refused
    model = dense_model(width=24)
    res["mismatch"] = err_text(lambda: tape_step(model, tf.keras.optimizers.SGD(0.1),
                                                 gq.QSGD(name="psm", process_set=PS0))(x, y))
    res["after"] = float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="psets.after"))
    return res


# -- 4. state keyed by variable: freeze, unfreeze, recompile -----------------------------------------
@section("keys")
def _keys():
    res = {}
    model = dense_model(width=8)  # two 8x8 kernels and two 8-biases: same shapes
    comp = gq.ORQ(levels=3, ef=True, name="keys", pattern="gather")
    x, y = data(3)

    def fit(tag):
        model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp), LOSS)
        model.fit(x, y, epochs=2, batch_size=8, verbose=0)
        res[tag] = {s["key"]: s["steps"] for s in comp.slots()}

    first = model.layers[0]
    first.trainable = False
    fit("frozen")  # the first layer's slots do not exist yet
    first.trainable = True
    fit("unfrozen")  # created in a later trace of a new training function
    before = {k: comp.residuals[k].numpy().copy() for k in comp.residuals}
    first.trainable = False
    fit("refrozen")  # same-shape dense_1 must not take over dense's residual or stream
    res["frozen_residual_kept"] = all(np.array_equal(before[v.name], comp.residuals[v.name].numpy())
                                      for v in first.trainable_weights + first.non_trainable_weights)
    res["others_moved"] = all(not np.array_equal(before[v.name], comp.residuals[v.name].numpy())
                              for v in model.layers[1].trainable_weights)
    first.trainable = True
    res["digest"] = digest(v.numpy() for v in model.trainable_variables)
    res["names"] = [v.name for v in model.trainable_variables]
    # the residuals are checkpointed by variable name, and restored into a fresh compressor
    path = tf.train.Checkpoint(compressor=comp).save(os.path.join(tempfile.mkdtemp(), "k"))
    comp2 = gq.ORQ(levels=3, ef=True, name="keys")
    tf.train.Checkpoint(compressor=comp2).restore(path)
    model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp2), LOSS)
    model.train_on_batch(x[:8], y[:8])
    res["restored_keys"] = sorted(comp2.residuals)
    res["restored_steps"] = {s["key"]: s["steps"] for s in comp2.slots()}
    return res


# -- 5. dynamic shapes: sparse_as_dense with an Embedding (Keras and a tape) -------------------------
@section("dynamic")
def _dynamic():
    res = {}
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((5,), dtype="int32"), tf.keras.layers.Embedding(50, 64),
                                 tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(2)])
    comp = gq.QSGD(ef=True, name="dyn")
    model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp, sparse_as_dense=True),
                  LOSS)
    rng = np.random.default_rng(rank)
    hist = model.fit(rng.integers(0, 50, (32, 5)), rng.integers(0, 2, 32), batch_size=8, epochs=2, verbose=0)
    res["keras_loss"] = [float(v) for v in hist.history["loss"]]
    res["keras_slots"] = sorted(s["shape"] for s in comp.slots())
    res["keras_digest"] = digest(v.numpy() for v in model.trainable_variables)
    # a gradient of unknown static shape with no variable to tell it: Horovod's own allreduce
    comp = gq.QSGD(name="dyn2")

    @tf.function(input_signature=[tf.TensorSpec((None, 64), tf.float32)])
    def red(t):
        return hvd.allreduce(t, op=hvd.Sum, compression=comp, name="dyn.red")
    t = tf.constant(np.full((3, 64), rank + 1.0, np.float32))
    res["unknown_shape_sum"] = red(t).numpy().tolist()[0][:2]
    return res


# -- 6. nonfinite=propagate: every scheme, both patterns; EF keeps its residual ---------------------
PROPAGATE = ["none", "fp16", "uniform", "qsgd", "terngrad", "sign:ef=true", "topk:ratio=0.1,ef=true",
             "bingrad:ef=true", "orq:levels=3", "orq:levels=5,ef=true"]


@section("propagate")
def _propagate():
    res = {}
    n = 1200  # buckets of 512: [0, 512) [512, 1024) [1024, 1200)
    for spec in PROPAGATE:
        pats = ["gather", "summable"] if spec.split(":")[0] in ("uniform", "qsgd", "terngrad") else ["gather"]
        for pat in pats:
            sep = "," if ":" in spec else ":"
            full = f"{spec}{sep}nonfinite=propagate" + ("" if "ef=" in spec else ",ef=true")
            comp = gq.from_spec(full, pattern=pat, name=f"nf{len(res)}")
            w = tf.Variable(tf.zeros((n,)), name=f"w{len(res)}")

            @tf.function
            def step(c, comp=comp, w=w):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(w * c)
                tape = hvd.DistributedGradientTape(tape, compression=comp)
                return tape.gradient(loss, [w])[0]

            rng = np.random.default_rng(rank)
            rec = {}
            step(tf.constant(rng.standard_normal(n).astype(np.float32)))
            r0 = next(iter(comp.residuals.values())).numpy().copy()
            c = rng.standard_normal(n).astype(np.float32)
            if rank == 1:
                c[700] = np.inf
            g = step(tf.constant(c)).numpy()
            r1 = next(iter(comp.residuals.values())).numpy()
            rec["bad_at_700"] = bool(not np.isfinite(g[700]))
            rec["first_bucket_finite"] = bool(np.isfinite(g[:512]).all())
            rec["residual_finite"] = bool(np.isfinite(r1).all())
            bad = ~np.isfinite(g)  # where the result is not finite, the previous residual is kept
            rec["residual_kept_where_nonfinite"] = bool(np.array_equal(r0[bad], r1[bad]))
            rec["residual_moved_elsewhere"] = bool(bad.all() or not np.array_equal(r0[~bad], r1[~bad]))
            rec["bad_count"] = int(bad.sum())
            g2 = step(tf.constant(rng.standard_normal(n).astype(np.float32))).numpy()
            rec["recovered"] = bool(np.isfinite(g2).all())
            rec["digest"] = digest([np.nan_to_num(g, nan=7.0), g2])
            res[f"{full}/{pat}"] = rec
    return res


# -- 7. loss scaling: an overflow step skipped on every rank, residuals in unscaled units ----------
@section("lossscale")
def _lossscale():
    res = {}
    # fixed power-of-two scales: codes are scale-equivariant, so residuals stored unscaled agree bit
    # for bit; the dynamic run overflows on rank 1 at step 2 (an inf loss): skipped on every rank
    for label, scale, dynamic in (("s10", 2.0 ** 10, False), ("s4", 2.0 ** 4, False), ("dyn", 2.0 ** 10, True)):
        model = dense_model(width=24)
        holder = {}
        comp = gq.QSGD(levels=4, ef=True, nonfinite="propagate", pattern="gather", name=f"ls{label}",
                       loss_scale=lambda holder=holder: holder["opt"].loss_scale)
        inner = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp)
        opt = tf.keras.mixed_precision.LossScaleOptimizer(inner, dynamic=dynamic, initial_scale=scale)
        holder["opt"] = opt

        @tf.function
        def step(x, y, bad, model=model, opt=opt):
            with tf.GradientTape() as tape:
                loss = LOSS(y, model(x, training=True)) * bad
            gv = opt.compute_gradients(loss, model.trainable_variables, tape=tape)
            opt.apply_gradients(gv)

        rec = {}
        for i in range(4):
            bad = np.float32(np.inf if (i == 2 and rank == 1 and dynamic) else 1.0)
            w_before = digest(v.numpy() for v in model.trainable_variables)
            r_before = digest(r.numpy() for r in comp.residuals.values())
            step(*data(i, n_in=8), tf.constant(bad))
            if i == 2:
                rec["skipped"] = w_before == digest(v.numpy() for v in model.trainable_variables)
                rec["residuals_kept"] = r_before == digest(r.numpy() for r in comp.residuals.values())
                rec["scale_after"] = float(opt.loss_scale)
        rec["weights"] = digest(v.numpy() for v in model.trainable_variables)
        rec["residuals"] = digest(r.numpy() for r in comp.residuals.values())
        rec["residual_max"] = max(float(np.abs(r.numpy()).max()) for r in comp.residuals.values())
        rec["finite"] = all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)
        res[label] = rec
    return res


# -- 8. the standard checkpoint recipe: rank 0 saves, every rank restores (or rank 0 restores and
# broadcasts) -------------------------------------------------------------------------------------
@section("ckptrank")
def _ckptrank():
    res = {}
    base = os.path.join(os.environ.get("HVD_GRADQ_TEST_OUT") or tempfile.mkdtemp(), "ckr")  # shared by the ranks
    x, y = data(5)

    def fresh():
        model = dense_model(width=24)
        opt = tf.keras.optimizers.SGD(0.1)
        comp = gq.ORQ(levels=3, ef=True, name="ckr", pattern="gather")
        return model, opt, comp, tape_step(model, opt, comp)

    model, opt, comp, step = fresh()
    for i in range(3):
        step(*data(i))
    # every rank writes its own file; rank 0's is the one Horovod's recipe restores everywhere
    tf.train.Checkpoint(model=model, compressor=comp).write(os.path.join(base, f"r{rank}"))
    hvd.allreduce(tf.constant(0.0), name="ckr.barrier")  # rank 0's file exists before anyone reads it
    step(x, y)  # the uninterrupted run's next step, for "own" to match
    res["straight_next"] = digest(r.numpy() for r in comp.residuals.values())
    for mode in ("own", "rank0", "oracle", "bcast"):
        model, opt, comp, step = fresh()
        src = os.path.join(base, "r0" if mode != "own" else f"r{rank}")
        if mode == "bcast":  # Horovod's habit: rank 0 restores, then broadcasts (refused before a trace)
            res["bcast_early"] = err_text(lambda comp=comp: comp.broadcast_state(root_rank=0))
        if mode != "bcast" or rank == 0:
            tf.train.Checkpoint(model=model, compressor=comp).read(src).assert_existing_objects_matched()
        step.get_concrete_function(x, y)  # slots are created (and restored) by the trace
        if mode == "bcast":
            hvd.broadcast_variables(model.variables, root_rank=0)
            comp.broadcast_state(root_rank=0)
        res[f"{mode}_steps"] = [s["steps"] for s in comp.slots()]
        res[f"{mode}_owners"] = sorted({int(o.numpy()) for o in comp.owners.values()})
        if mode == "oracle":  # what "another rank's residual is not used" means: start from zero
            for k in comp.residuals:
                if int(comp.owners[k].numpy()) != rank:
                    comp.residuals[k].assign(tf.zeros_like(comp.residuals[k]))
                    comp.owners[k].assign(rank)
        step(x, y)
        res[f"{mode}_next"] = digest(r.numpy() for r in comp.residuals.values())
        res[f"{mode}_owners_after"] = sorted({int(o.numpy()) for o in comp.owners.values()})
    # rank 0 restores and broadcast_state is forgotten, with warm-up (rank 0's counters past it,
    # rank 1's in it: they would take different branches): hvd_gradq's error on every rank at the
    # first step and at every step after it, and no collective left half-started
    model, opt = dense_model(width=24), tf.keras.optimizers.SGD(0.1)
    comp = gq.ORQ(levels=3, ef=True, warmup=2, name="ckf", pattern="gather")
    step = tape_step(model, opt, comp)
    if rank == 0:
        tf.train.Checkpoint(model=model, compressor=comp).read(os.path.join(base, "r0")).assert_existing_objects_matched()
    for key in ("forgot", "forgot_again"):
        text = err_text(lambda: step(x, y), 100_000)
        res[key] = text[:120] + " ... " + text[text.find("RankMismatchError"):][:2000]  # TF's frames, then ours
    res["forgot_steps"] = sorted({int(v.numpy()) for v in comp.steps.values()})  # no counter moved
    res["after"] = float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="ckr.after"))
    return res


# -- 9. elastic Horovod: the reduction runs eagerly in one host function a gradient ---------------
@section("elastic")
def _elastic():
    """With HOROVOD_ELASTIC set (what horovodrun sets in an elastic job) the compressor reduces each
    gradient eagerly inside a tf.py_function, in the world of that step: the same bits as the traced
    graph gives, residuals included, for each pattern; and Horovod's TF states save it."""
    res = {}
    cases = (("orq:levels=5,ef=true", "gather"), ("qsgd:levels=4,ef=true", "summable"),
             ("orq:levels=3,ef=true", "scatter"), ("topk:ratio=0.1,ef=true", "gather"),
             ("bingrad:ef=true,warmup=1", "auto"))
    for i, (spec, pattern) in enumerate(cases):
        model = dense_model(width=300)
        graph = gq.from_spec(spec, pattern=pattern, name=f"elg{i}")
        os.environ["HOROVOD_ELASTIC"] = "1"
        try:
            eager = gq.from_spec(spec, pattern=pattern, name=f"ele{i}")
        finally:
            del os.environ["HOROVOD_ELASTIC"]
        steps = [tape_step(model, tf.keras.optimizers.SGD(0.0), c) for c in (graph, eager)]
        same = []
        for k in range(3):
            x, y = data(30 + k)
            a, b = ([g.numpy() for g in f(x, y)] for f in steps)
            same.append(all(u.tobytes() == v.tobytes() for u, v in zip(a, b)))
        res[spec + "/" + pattern] = {
            "same": same, "patterns": [s["pattern"] for s in eager.slots()] == [s["pattern"] for s in graph.slots()],
            "residuals": [digest([graph.residuals[k].numpy()]) == digest([eager.residuals[k].numpy()])
                          for k in graph.residuals],
            "steps": [int(v.numpy()) for v in eager.steps.values()]}
    # Horovod's TF state commits and restores the compressor with the model
    comp = eager
    state = hvd.elastic.TensorFlowKerasState(model, tf.keras.optimizers.SGD(0.0), batch=0)
    state.commit()
    before = digest(v.numpy() for v in comp.residuals.values())
    x, y = data(40)
    steps[1](x, y)
    moved = digest(v.numpy() for v in comp.residuals.values()) != before
    state.restore()
    res["restore"] = {"moved": moved, "back": digest(v.numpy() for v in comp.residuals.values()) == before,
                      "steps": [int(v.numpy()) for v in comp.steps.values()]}
    return res


# -- 10. warm-up: the first steps exact, then compressed, in a tape and in Keras fit -----------------
@section("warmup")
def _warmup():
    res = {}
    for spec, pattern in (("orq:levels=3,ef=true,warmup=2", "gather"), ("qsgd:levels=4,ef=true,warmup=2", "summable")):
        model = dense_model(width=300)
        stock_step = tape_step(model, tf.keras.optimizers.SGD(0.0), hvd.Compression.none)
        comp = gq.from_spec(spec, pattern=pattern, name=f"wu{len(res)}")
        ours_step = tape_step(model, tf.keras.optimizers.SGD(0.0), comp)  # lr 0: the same weights
        errs, residual_norms = [], []
        for step in range(4):
            x, y = data(10 + step)
            stock = [g.numpy() for g in stock_step(x, y)]
            ours = [g.numpy() for g in ours_step(x, y)]
            errs.append(max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(stock, ours)))
            residual_norms.append(sum(float(np.abs(v.numpy()).sum()) for v in comp.residuals.values()))
        res[spec] = {"errs": errs, "residuals": residual_norms, "steps": [int(v.numpy()) for v in comp.steps.values()],
                     "patterns": sorted({s["pattern"] for s in comp.slots()})}
    model = dense_model(width=300)
    comp = gq.from_spec("bingrad:ef=true,warmup=3", name="wufit")
    model.compile(hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=comp), LOSS)
    x, y = data(20, batch=64)
    hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    res["fit"] = {"loss": [float(v) for v in hist.history["loss"]], "steps": [int(v.numpy()) for v in comp.steps.values()],
                  "weights": digest(model.get_weights())}
    return res


# -- 11. a rank that retraces alone (a ragged last batch) ----------------------------------------
@section("ragged")
def _ragged():
    """Rank 1's last batch is smaller: its tf.function retraces, the other's does not. Horovod's
    operand must not be a constant (Grappler would run its allreduce while optimizing rank 1's new
    graph only, and the job would hang); every pattern finishes the step, ranks equal."""
    res = {}
    for spec, pattern in (("orq:levels=5,ef=true", "gather"), ("qsgd:levels=4", "summable"),
                          ("orq:levels=3,ef=true", "scatter")):
        model = dense_model(width=300)
        comp = gq.from_spec(spec, pattern=pattern, name=f"rg{len(res)}")
        step = tape_step(model, tf.keras.optimizers.SGD(0.01), comp)
        for i in range(3):
            x, y = data(50 + i, batch=7 if (i == 2 and rank == 1) else 16)
            step(x, y)
        res[pattern] = {"steps": [int(v.numpy()) for v in comp.steps.values()], "weights": digest(model.get_weights())}
    return res


_ = GradqError
report(rank, out)
