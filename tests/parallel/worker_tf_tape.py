"""hvd_gradq.tensorflow with hvd.DistributedGradientTape: checkpoint/resume, dtypes, eager,
sparse gradients, Sum vs Average, the NumPy oracle, and a rank-configuration mismatch.

Each section reports what the launching test (tests/parallel/test_tf.py) checks; ``--only``
runs a comma-separated subset of sections.
"""
import argparse
import contextlib
import hashlib
import io
import os
import tempfile
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from harness import report

import hvd_gradq
import hvd_gradq.tensorflow as gq
from hvd_gradq.api import split
from hvd_gradq.errors import GradqError
from hvd_gradq.plan.decide import decide
from hvd_gradq.plan.pattern import EVERY, Pattern

ap = argparse.ArgumentParser()
ap.add_argument("--only", default="")
ap.add_argument("--ckpt-specs", default="orq:levels=3,ef=true;qsgd:ef=true")
args = ap.parse_args()
only = set(filter(None, args.only.split(",")))

hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
rank, size = hvd.rank(), hvd.size()
out: dict = {"size": size}


def want(section: str) -> bool:
    """Whether to run a section; its CPU seconds are reported under "cpu"."""
    if only and section not in only:
        return False
    out.setdefault("cpu", {})[section] = -time.process_time()
    return True


def done(section: str) -> None:
    out["cpu"][section] += time.process_time()


def digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def build(dtype="float32", seed=0):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([
        tf.keras.Input((12,), dtype=dtype),
        tf.keras.layers.Dense(48, activation="tanh", dtype=dtype),  # 576 = a bucket of 512 and a tail
        tf.keras.layers.Dense(3, dtype=dtype),
    ])
    return model


def batch(step, dtype="float32"):
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((16, 12)).astype(dtype)
    y = rng.integers(0, 3, 16)
    return tf.constant(x), tf.constant(y)


def make_step(model, opt, comp, eager=False):
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step if eager else tf.function(step)


# -- 1. checkpoint after 50 steps, resume, same weights after 100 as an uninterrupted run -------
HALF, FULL = 50, 100
if want("ckpt"):
    ckdir = os.path.join(tempfile.gettempdir(), f"hvdq-tf-ckpt-{os.getpid()}")
    res = {}
    for spec in args.ckpt_specs.split(";"):
        def fresh(spec=spec):
            model = build()
            opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
            comp = gq.from_spec(spec, name="ck")
            return model, opt, comp, make_step(model, opt, comp)

        model, opt, comp, step = fresh()
        for i in range(FULL):
            step(*batch(i))
        straight = digest(model.trainable_variables)
        straight_res = [r.numpy().tobytes() for r in comp.residuals.values()]
        n_slots = len(comp.slots())

        model, opt, comp, step = fresh()
        for i in range(HALF):
            step(*batch(i))
        at5 = {"residuals": [r.numpy().copy() for r in comp.residuals.values()], "steps": [s["steps"] for s in comp.slots()]}
        path = tf.train.Checkpoint(model=model, optimizer=opt, compressor=comp).save(os.path.join(ckdir, "c"))

        model, opt, comp, step = fresh()  # new objects: nothing carried over but the checkpoint
        status = tf.train.Checkpoint(model=model, optimizer=opt, compressor=comp).restore(path)
        x0, y0 = batch(HALF)
        step.get_concrete_function(x0, y0)  # the trace creates the slots: restored on creation
        restored = [r.numpy() for r in comp.residuals.values()]
        status.assert_existing_objects_matched()
        for i in range(HALF, FULL):
            step(*batch(i))
        resumed = digest(model.trainable_variables)
        res[spec] = {
            "straight": straight,
            "resumed": resumed,
            "slots": n_slots,
            "residuals_exact": all(np.array_equal(a, b) for a, b in zip(at5["residuals"], restored))
            and len(restored) == len(at5["residuals"]),
            "residuals_nonzero": any(float(np.abs(r).max()) > 0 for r in at5["residuals"]),
            "steps_at5": at5["steps"],
            "steps_end": [s["steps"] for s in comp.slots()],
            "residual_end_same": [r.numpy().tobytes() for r in comp.residuals.values()] == straight_res,
        }
    out["ckpt"] = res
    done("ckpt")

# -- 2. gradient dtypes: fp16, bf16, fp64 (and fp32), compressed and cast back ----------------
if want("dtypes"):
    res = {}
    cases = [("float16", "qsgd:ef=true"), ("bfloat16", "orq:levels=3"), ("float64", "topk:ratio=0.2,ef=true"),
             ("float32", "uniform:bits=4")]
    for dtype, spec in cases:
        model = build(dtype)
        opt = tf.keras.optimizers.SGD(0.05)
        comp = gq.from_spec(spec)
        step = make_step(model, opt, comp)
        losses = [float(step(*batch(i, "float32" if dtype == "bfloat16" else dtype))) for i in range(3)]
        res[dtype] = {"digest": digest(model.trainable_variables), "finite": bool(np.isfinite(losses).all()),
                      "var_dtypes": sorted({v.dtype.name for v in model.trainable_variables}),
                      "slot_dtypes": sorted({s["dtype"] for s in comp.slots()}),
                      "steps": [s["steps"] for s in comp.slots()]}
    out["dtypes"] = res
    done("dtypes")

# -- 3. an eager tape (Horovod wraps the reduction in its own tf.function) ---------------------
if want("eager"):
    model = build()
    opt = tf.keras.optimizers.SGD(0.1)
    comp = gq.ORQ(levels=3, ef=True)
    step = make_step(model, opt, comp, eager=True)
    for i in range(3):
        step(*batch(i))
    out["eager"] = {"digest": digest(model.trainable_variables), "steps": [s["steps"] for s in comp.slots()]}
    done("eager")

# -- 4. sparse gradients: Horovod allgathers IndexedSlices itself unless sparse_as_dense --------
if want("sparse"):
    res = {}
    for dense in (False, True):
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((5,), dtype="int32"), tf.keras.layers.Embedding(50, 8),
                                     tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(2)])
        opt = tf.keras.optimizers.SGD(0.1)
        comp = gq.QSGD(ef=True)

        @tf.function
        def sstep(x, y, model=model, opt=opt, comp=comp, dense=dense):
            with tf.GradientTape() as tape:
                loss = tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
            tape = hvd.DistributedGradientTape(tape, compression=comp, sparse_as_dense=dense)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        for i in range(3):
            rng = np.random.default_rng(10 * i + rank)
            sstep(tf.constant(rng.integers(0, 50, (8, 5)), tf.int32), tf.constant(rng.integers(0, 2, 8)))
        res["dense" if dense else "sparse"] = {"digest": digest(model.trainable_variables),
                                               "slot_shapes": [s["shape"] for s in comp.slots()]}
    out["sparse"] = res
    done("sparse")

# -- 5. Sum and Average, and the NumPy oracle for the decoded sum ------------------------------
if want("oracle"):
    res = {}
    rng = np.random.default_rng(rank)
    t = tf.constant(rng.standard_normal((37, 29)).astype(np.float32))
    for spec in ["none", "orq:levels=5", "bingrad:variant=pb,ef=false", "topk:ratio=0.1", "sign", "fp16"]:
        comp = gq.from_spec(spec, pattern="gather")

        @tf.function
        def red(t, comp=comp):
            c1, ctx1 = comp.compress(t)
            avg = comp.decompress(hvd.allreduce(c1, op=hvd.Average, name="oracle.avg"), ctx1)
            c2, ctx2 = comp.compress(t)
            tot = comp.decompress(hvd.allreduce(c2, op=hvd.Sum, name="oracle.sum"), ctx2)
            return avg, tot, ctx1.result, ctx2.result

        avg, tot, g1, g2 = red(t)
        # the NumPy reference: parse the gathered payloads, decode each, sum in rank order
        ok = True
        for res_bytes, got, avg_ in ((g1, avg, True), (g2, tot, False)):
            payloads = split(res_bytes.numpy())
            ref = None
            for p in payloads:
                v = hvd_gradq.dequantize(p).reshape(-1)
                ref = v.copy() if ref is None else ref + v
            ref = (ref / np.float32(size)) if avg_ else ref
            ok = ok and len(payloads) == size and np.array_equal(ref.reshape(37, 29), got.numpy())
        entry = {"oracle_equal": bool(ok), "digest": digest([avg, tot])}
        if spec == "none":
            allt = hvd.allgather(tf.reshape(t, (1, 37, 29)), name="oracle.raw").numpy()
            exact = allt[0].copy()
            for r in range(1, size):
                exact = exact + allt[r]
            entry["sum_exact"] = bool(np.array_equal(exact, tot.numpy()))
            entry["avg_exact"] = bool(np.array_equal(exact / np.float32(size), avg.numpy()))
        res[spec] = entry
    # an eager hvd.allreduce(compression=...) works without error feedback, and refuses it
    plain = hvd.allreduce(t, op=hvd.Average, name="oracle.plain").numpy()
    e0 = hvd.allreduce(t, compression=gq.NoCompression(), op=hvd.Average, name="oracle.eager0").numpy()
    e1 = hvd.allreduce(t, compression=gq.QSGD(levels=4), op=hvd.Average, name="oracle.eager1").numpy()
    step = hvd.allreduce(tf.reduce_max(tf.abs(t)), op=hvd.Max, name="oracle.max").numpy() / 4
    res["eager_none_close"] = bool(np.allclose(e0, plain, rtol=1e-6, atol=1e-6))
    res["eager_qsgd_within_step"] = bool(np.abs(e1 - plain).max() <= step * 1.0001)
    try:
        hvd.allreduce(t, compression=gq.QSGD(ef=True), name="oracle.eager.ef")
        res["eager_ef_refused"] = False
    except GradqError:
        res["eager_ef_refused"] = True
    out["oracle"] = res
    done("oracle")

# -- 5b. telemetry: stats() and metrics() after 3 steps, each gradient's pattern and why against
#        the shared policy, and the first-step log line (stderr: rank 0 only, by default) ----------
if want("telemetry"):
    spec, link = "orq:levels=5", 1.0
    model, opt = build(), tf.keras.optimizers.SGD(0.1)
    comp = gq.from_spec(f"{spec},link_gbps={link:g},log_every=2", name="tm")  # options in the line, as HVD_GRADQ
    step = make_step(model, opt, comp)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the line comes from a host callback of step 2
        for i in range(3):
            step(*batch(i))
    choices = {v.name: decide(hvd_gradq.parse(spec), int(np.prod(v.shape)), len(v.shape), size, Pattern.AUTO,
                              EVERY, 1, link, comp.fallback, comp._figures[0])  # as the compressor decides
               for v in model.trainable_variables}
    decided = {k: (c.pattern, c.why) for k, c in choices.items()}
    out["telemetry"] = {"stats": comp.stats(), "metrics": comp.metrics(), "stderr": err.getvalue(),
                        "summary": comp.summary(),
                        "decided": {k: [p.value, why] for k, (p, why) in decided.items()}}
    done("telemetry")

# -- 6. ranks that disagree on the configuration fail on every rank, naming the difference; ranks
#       that differ only in check_ranks run ------------------------------------------------------
if want("mismatch"):
    comp = gq.ORQ(levels=5 if rank == 0 else 9, name="mm")
    model = build()
    step = make_step(model, tf.keras.optimizers.SGD(0.1), comp)
    try:
        step(*batch(0))
        out["mismatch"] = "no error"
    except Exception as e:  # AutoGraph re-raises it as a StagingError carrying the message
        out["mismatch"] = f"{type(e).__name__}: {e}"
    # only check_ranks differs (issue 35, item 8): every rank still sends its block, and both run
    step = make_step(build(), tf.keras.optimizers.SGD(0.1), gq.ORQ(levels=5, name="cr", check_ranks=rank == 0))
    try:
        step(*batch(0))
        out["check_ranks"] = "ran"
    except Exception as e:
        out["check_ranks"] = f"{type(e).__name__}: {e}"
    done("mismatch")

# -- 6b. error feedback inside the encode: the bits of the compensate op, the encode and the
#        residual op one after the other (the graph's own operations below 2**20 elements) --------
if want("fed"):
    from hvd_gradq.tensorflow import host as tf_host
    from hvd_gradq.tensorflow import residuals

    res = {}
    for spec in ("bingrad", "orq:levels=5,ef=true", "uniform:bits=4,ef=true,pattern=scatter,clip=2"):
        got = {}
        for mode in ("fed", "unfed"):
            real_fed, real_enc = residuals.fed, tf_host.fed_encoder
            traced = []

            def counting(*a, real=real_enc, traced=traced, **k):
                traced.append(1)  # a fused encode traced into the graph
                return real(*a, **k)

            if mode == "unfed":
                residuals.fed = lambda *a, **k: None
            else:
                tf_host.fed_encoder = counting
            try:
                model = build(seed=3)
                comp = gq.from_spec(spec, name="fed")
                step = make_step(model, tf.keras.optimizers.SGD(0.1, momentum=0.9), comp)
                for i in range(12):
                    step(*batch(i))
            finally:
                residuals.fed, tf_host.fed_encoder = real_fed, real_enc
            got[mode] = {"digest": digest(model.trainable_variables), "traced": len(traced),
                         "residuals": hashlib.sha256(b"".join(r.numpy().tobytes()
                                                              for r in comp.residuals.values())).hexdigest(),
                         "nonzero": any(float(np.abs(r.numpy()).max()) > 0 for r in comp.residuals.values())}
        res[spec] = got
    out["fed"] = res
    done("fed")

# -- 7. a NaN in one rank's gradient (nonfinite=raise) stops every rank with an error ------------
if want("nonfinite"):
    # (the overflow case first: the NaN cases may end in a stall shutdown, see test_tf.py)
    # a finite value the scheme refuses (fp16:overflow=raise, gather) on rank 1: it sends a marked
    # row instead of raising before the allgather, and every rank's decode raises naming it
    model, comp, opt = build(), gq.from_spec("fp16:overflow=raise", name="ov"), tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def scaled_step(x, y, scale):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * scale
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    scaled_step(*batch(0), tf.constant(1.0))
    try:
        scaled_step(*batch(1), tf.constant(1e9 if rank == 1 else 1.0))  # gradients far beyond 65504
        out["fp16_overflow"] = "no error"
    except Exception as e:
        out["fp16_overflow"] = f"{type(e).__name__}: {e}"[:20000]  # TF puts its traced stack first: keep the message after it
    res = {}
    for spec in ("orq:levels=5,nonfinite=raise", "qsgd:levels=4,nonfinite=raise"):  # gather, summable
        model = build()
        step = make_step(model, tf.keras.optimizers.SGD(0.1), gq.from_spec(spec, name="nf"))
        x, y = batch(1)
        if rank == 1:
            x = tf.tensor_scatter_nd_update(x, [[0, 0]], [float("nan")])
        try:  # (a stall shutdown in the first spec fails the second's first step too)
            step(*batch(0))
            step(x, y)
            res[spec] = "no error"
        except Exception as e:  # TF wraps it (InvalidArgumentError); the message is hvd_gradq's
            res[spec] = f"{type(e).__name__}: {e}"[:20000]  # TF puts its traced stack first: keep the message after it
    out["nonfinite"] = res
    done("nonfinite")

# -- 8. a rank that dies mid-run ends the whole job (the launcher names it) -------------------------
if args.only == "die":
    model = build()
    step = make_step(model, tf.keras.optimizers.SGD(0.1), gq.ORQ(levels=5, name="die"))
    for i in range(2):
        step(*batch(i))
    if rank == 1:
        os._exit(3)
    for i in range(2, 10**6):
        step(*batch(i))

# -- 9. a rank that never reaches its first step: the other's handshake raises within its bound
#       (HVD_GRADQ_HANDSHAKE_TIMEOUT, set by the test), uncaught, and the job ends -----------------
if args.only == "stall":
    step = make_step(build(), tf.keras.optimizers.SGD(0.1), gq.ORQ(levels=5, name="stall"))
    if rank == 1:
        time.sleep(600)
    step(*batch(0))

report(rank, out)
