"""TensorFlow's Ops namespace (hvd_gradq/tensorflow/ops.py) against the NumPy reference, byte for
byte, for every scheme: eagerly and inside ``tf.function`` (where Grappler rewrites graphs), and
the TF compressor in one process (Horovod at size 1: the collectives are identities)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import hvd_gradq  # noqa: E402
from hvd_gradq import Payload  # noqa: E402
from hvd_gradq.errors import GradqError  # noqa: E402
from hvd_gradq.spec import names, parse_scheme  # noqa: E402
from hvd_gradq.tensorflow.ops import TF  # noqa: E402
from hvd_gradq.xp import (  # noqa: E402
    NUMPY,
    first_argmax,
    scan_sum,
    seed_words,
    step_words,
    tree_sum,
    uniforms,
)

# Every registered scheme, with the parameters that change its arithmetic.
SPECS = [
    "none", "fp16", "fp16:overflow=saturate",
    "uniform:bits=8", "uniform:bits=3,bucket=100", "uniform:bits=1,clip=2.0", "uniform:bits=4,rounding=stochastic",
    "qsgd", "qsgd:levels=1,norm=l2", "qsgd:scales=fp16,bucket=64",
    "terngrad", "terngrad:clip=0.0",
    "sign", "sign:bucket=7,scales=fp16",
    "topk:ratio=0.1", "topk:ratio=0.3,values=orq", "topk:ratio=0.05,values=none", "topk:ratio=0.2,values=qsgd",
    "bingrad", "bingrad:variant=pb", "bingrad:clip=2.0,bucket=64",
    "orq:levels=2", "orq:levels=3", "orq:levels=4,bucket=64", "orq:levels=5", "orq:levels=9",
    "orq:levels=5,scales=fp16,clip=2.5", "orq:levels=20,bucket=128",
]
# In a graph: one spec per scheme name (tracing the heavier ones costs seconds each).
GRAPH_SPECS = ["none", "fp16", "uniform:bits=3,bucket=100", "qsgd:scales=fp16,bucket=64", "terngrad", "sign",
               "topk:ratio=0.3,values=qsgd", "bingrad:variant=pb", "orq:levels=5"]
SIZES = [1, 7, 512, 1300]


def _data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, n).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
    if n > 20:
        x[rng.integers(0, n, 4)] = 0.0  # exact zeros and repeats
        x[rng.integers(0, n, 2)] = x[0]
    return x


def _wire(parts: dict) -> dict:
    """Sections as they go on the wire (int64 byte values as uint8), NumPy arrays."""
    out = {}
    for k, v in parts.items():
        a = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        out[k] = a.astype(np.uint8) if a.dtype == np.int64 else a
    return out


def _as_decode_input(wire: dict) -> dict:
    return {k: (v.astype(np.int64) if v.dtype == np.uint8 else v) for k, v in wire.items()}


def _assert_same(ref: dict, got: dict, what: str) -> None:
    assert sorted(ref) == sorted(got), what
    for k in ref:
        assert ref[k].dtype == got[k].dtype, (what, k, ref[k].dtype, got[k].dtype)
        assert ref[k].tobytes() == got[k].tobytes(), (what, k, np.flatnonzero(ref[k] != got[k])[:8])


def test_every_registered_scheme_is_covered():
    assert {s.split(":")[0] for s in SPECS} == set(names())
    assert {s.split(":")[0] for s in GRAPH_SPECS} == set(names())


@pytest.mark.parametrize("spec", SPECS)
def test_eager_encode_decode_bit_identical(spec):
    scheme = parse_scheme(spec)
    for n in SIZES:
        x = _data(n, n)
        ref = _wire(scheme.encode(NUMPY, x, 1234 + n))
        got = _wire(scheme.encode(TF, tf.constant(x), 1234 + n))
        _assert_same(ref, got, f"{spec} n={n} encode")
        dref = np.asarray(scheme.decode(NUMPY, _as_decode_input(ref), n))
        dgot = scheme.decode(TF, {k: tf.constant(v) for k, v in _as_decode_input(ref).items()}, n).numpy()
        assert dref.dtype == dgot.dtype == np.float32
        assert dref.tobytes() == dgot.tobytes(), (spec, n, "decode")


@pytest.mark.parametrize("spec", GRAPH_SPECS)
def test_graph_encode_decode_bit_identical(spec):
    """Inside a tf.function with TF's default Grappler, through the codec the compressor's
    gather pattern uses (:class:`hvd_gradq.tensorflow.transport.GraphCodec`: input and seed words
    as graph tensors, the compiled kernels where the scheme has one): the payload, this rank's
    decoded values and the decoded sum of the gathered payloads are the NumPy reference's, bit
    for bit."""
    from hvd_gradq.tensorflow.transport import GraphCodec, Own

    scheme = parse_scheme(spec)
    n = 1300  # two full buckets of 512 and a tail (or more, for smaller buckets)
    mine = GraphCodec(2, "t", True, header=((n,), "float32"))  # own values: what error feedback subtracts
    read = GraphCodec(2, "t", False, header=((n,), "float32"))  # every row decoded from its bytes

    @tf.function
    def run(x, a, b, other):
        payload, own = mine.encode(scheme, x, (a, b), "t")
        total, count = read.sum(tf.concat([other, payload], 0), 1, Own(n), "t")  # as from two ranks; this is rank 1
        assert count == 2
        return payload, total, own.values

    def reference(x, words):
        wire = _wire(scheme.encode(NUMPY, x, words))
        p = Payload(scheme, (n,), "float32", wire)
        return p.to_array(), np.asarray(scheme.decode(NUMPY, _as_decode_input(wire), n))

    other_payload, other_dec = reference(_data(n, 50), step_words(NUMPY, 98, np.int64(0)))
    for step in (0, 7):
        x = _data(n, step + 3)
        ref_payload, ref_dec = reference(x, step_words(NUMPY, 99, np.int64(step)))
        a, b = step_words(TF, 99, tf.constant(step, tf.int64))
        payload, total, own = run(tf.constant(x), a, b, tf.constant(other_payload))
        assert payload.shape == ref_payload.shape  # static: Horovod's allgather is traced with it
        assert ref_payload.tobytes() == payload.numpy().tobytes(), (spec, step, "graph encode")
        assert ref_dec.tobytes() == own.numpy().tobytes(), (spec, step, "graph decode")
        assert (other_dec + ref_dec).tobytes() == total.numpy().tobytes(), (spec, step, "graph sum")


def test_seed_words_and_uniforms_match():
    for step in [0, 1, 5, (1 << 32) + 3, (1 << 40) - 1]:
        ref = step_words(NUMPY, 12345, np.int64(step))
        got = step_words(TF, 12345, tf.constant(step, tf.int64))
        assert [int(v) for v in ref] == [int(v.numpy()) for v in got]
        ur = uniforms(NUMPY, ref, 1000, 777)
        ug = uniforms(TF, got, 1000, 777).numpy()
        assert ur.tobytes() == ug.tobytes()
        assert 0.0 <= ug.min() and ug.max() < 1.0
    # an int seed and its words give the same draws
    assert uniforms(NUMPY, 5, 0, 64).tobytes() == uniforms(TF, seed_words(5), 0, 64).numpy().tobytes()


def test_the_graphs_host_words_are_the_graph_forms_and_the_host_rules():
    """transport.words: the words a traced step computes from its step counter (a variable), in
    one host function, are step_words' in TF and in NumPy (PyTorch's host rule), step after step."""
    from hvd_gradq.reduce import names as streams
    from hvd_gradq.tensorflow.transport import words

    seed = streams.stream(7, 1, "dense/kernel:0#reduce")
    counter = tf.Variable(np.int64(0))

    @tf.function
    def step():
        s = counter.assign_add(1, read_value=True) - 1
        return words(seed, s), step_words(TF, seed, s)

    for k in [0, 1, 2, 3]:
        (a, b), (ta, tb) = step()
        assert a.shape == b.shape == ()  # static: the draws' shapes are traced with them
        want = [int(v) for v in step_words(NUMPY, seed, np.int64(k))]
        assert [int(a), int(b)] == [int(ta), int(tb)] == want, k
    assert [int(v) for v in words(seed, (1 << 40) - 1)] == [int(v) for v in step_words(NUMPY, seed, np.int64((1 << 40) - 1))]


def test_step_words_differ_per_step():
    words = {tuple(int(v) for v in step_words(NUMPY, 1, np.int64(s))) for s in range(1000)}
    assert len(words) == 1000


def test_sqrt_is_correctly_rounded():
    rng = np.random.default_rng(0)
    bits = rng.integers(0x00800000, 0x7F800000, 200_000, dtype=np.int64).astype(np.uint32)
    x = bits.view(np.float32)  # positive normal float32 bit patterns of every exponent
    x = np.concatenate([x, np.float32([0.0, 1.0, 2.0, 4.0, 3.4e38, 1.2e-38])])
    assert np.sqrt(x).tobytes() == TF.sqrt(tf.constant(x)).numpy().tobytes()


def test_float32_subnormals_are_flushed_by_tf():
    """Documents a limit of bit-identity: TF's CPU kernels run with flush-to-zero and
    denormals-are-zero, so float32 subnormals (|x| < 1.18e-38) count as 0 in TF, not in NumPy."""
    x = np.float32([1e-40, 1.0])
    assert np.sqrt(x)[0] > 0
    assert TF.sqrt(tf.constant(x)).numpy()[0] == 0.0


def test_to_f16_rounds_like_numpy():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.standard_normal(10_000).astype(np.float32) * np.float32(1e4),
        (rng.standard_normal(10_000) * 1e-6).astype(np.float32),  # fp16 subnormals
        np.float32([65504.0, 65519.99, 65520.0, -65520.0, 6e-8, 2.9802322e-08, 0.0, -0.0]),
    ])
    with np.errstate(over="ignore"):  # beyond 65520 both give inf
        ref = x.astype(np.float16)
    assert ref.tobytes() == TF.to_f16(tf.constant(x)).numpy().tobytes()


def test_tree_scan_and_first_argmax_match():
    rng = np.random.default_rng(2)
    for w in (1, 5, 512, 777):
        x = rng.standard_normal((3, w)).astype(np.float32)
        assert tree_sum(NUMPY, x).tobytes() == tree_sum(TF, tf.constant(x)).numpy().tobytes()
        assert scan_sum(NUMPY, x).tobytes() == scan_sum(TF, tf.constant(x)).numpy().tobytes()
        t = np.round(x * 2)  # ties
        assert np.array_equal(first_argmax(NUMPY, t), first_argmax(TF, tf.constant(t)).numpy())


def test_take_along_broadcasts_rows_and_topk_is_sorted():
    table = np.float32([[1.0, 2.0, 3.0]])
    idx = np.int64([[0, 2], [1, 1]])
    assert np.array_equal(TF.take_along(tf.constant(table), tf.constant(idx)).numpy(),
                          NUMPY.take_along(np.broadcast_to(table, (2, 3)), idx))
    x = np.float32([0.5, -3.0, 2.0, -0.1, 3.5])
    assert TF.topk_abs(tf.constant(x), 2).numpy().tolist() == NUMPY.topk_abs(x, 2).tolist() == [1, 4]
    assert TF.topk_abs(tf.constant(x), 9).numpy().tolist() == [0, 1, 2, 3, 4]


def test_fp16_overflow_check_eager_and_graph():
    big = tf.constant(np.float32([1.0, 70000.0]))
    with pytest.raises(GradqError, match="exceeds fp16's range"):
        parse_scheme("fp16:overflow=raise").encode(TF, big, 0)
    run = tf.function(lambda t: parse_scheme("fp16:overflow=raise").encode(TF, t, 0)["values"], autograph=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="a value exceeds fp16"):
        run(big)
    ok = np.float32([1.0, -65504.0, np.inf])  # non-finite values are the nonfinite policy's business
    assert run(tf.constant(ok)).numpy().tobytes() == ok.astype(np.float16).tobytes()


def test_host_only_primitives_refuse_graphs():
    with pytest.raises(GradqError, match="eager"):
        tf.function(lambda t: TF.to_numpy(t), autograph=False)(tf.constant([1.0]))
    fin = tf.function(TF.isfinite, autograph=False)(tf.constant([1.0, np.nan, -np.inf, 0.0]))  # graph-safe
    assert fin.numpy().tolist() == [True, False, False, True]


# -- the compressor in one process: Horovod at size 1 -------------------------------------------
@pytest.fixture(scope="module")
def hvd():
    hvd = pytest.importorskip("horovod.tensorflow")
    hvd.init()
    assert hvd.size() == 1
    return hvd


def _reduce(comp, hvd, tensors):
    """compress -> Horovod allreduce (Average) -> decompress, for several tensors in one trace."""
    outs, payloads = [], []
    for t in tensors:
        c, ctx = comp.compress(t)
        outs.append(comp.decompress(hvd.allreduce(c, op=hvd.Average), ctx))
        payloads.append(ctx.result if ctx.pattern.value == "gather" else tf.zeros((0,), tf.uint8))
    return outs, payloads


@pytest.mark.parametrize("spec", ["orq:levels=3", "qsgd:ef=true", "topk:ratio=0.1", "fp16", "bingrad:variant=pb",
                                  "uniform:bits=4,nonfinite=propagate", "sign:scales=fp16"])
def test_compressor_payload_is_the_reference_payload(hvd, spec):
    import hvd_gradq.tensorflow as gq
    from hvd_gradq.api import _wire as wire
    from hvd_gradq.xp import stream_seed

    comp = gq.from_spec(spec, pattern="gather", seed=11)
    shapes = [(30, 40), (7,)]
    rng = np.random.default_rng(3)
    gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    run = tf.function(lambda *ts: _reduce(comp, hvd, ts))
    residuals = [np.zeros(g.size, np.float32) for g in gs]
    for step in range(2):
        outs, payloads = run(*[tf.constant(g) for g in gs])
        for i, (g, out, pay) in enumerate(zip(gs, outs, payloads)):
            config = hvd_gradq.parse(spec)
            scheme = config.scheme
            words = step_words(NUMPY, stream_seed(11, 0, zlib.crc32(str(i).encode())), np.int64(step))
            x = g.reshape(-1)
            if config.policy.ef:
                x = x + residuals[i]
            ref = Payload(scheme, g.shape, "float32", {k: wire(np.asarray(v))
                                                       for k, v in scheme.encode(NUMPY, x, words).items()})
            assert pay.numpy().tobytes() == ref.to_array().tobytes(), (spec, i, step)
            p = Payload.from_bytes(pay.numpy())  # a valid payload: header, checksum, sections
            assert p.shape == g.shape and p.scheme.spec == scheme.spec
            assert out.numpy().tobytes() == hvd_gradq.dequantize(p).tobytes()
        if hvd_gradq.parse(spec).policy.ef:
            residuals = [comp.residuals[s["key"]].numpy() for s in comp.slots()]
    assert [s["steps"] for s in comp.slots()] == [2, 2]


def test_compressor_reports_pytorchs_metrics_and_a_summary(hvd):
    """metrics() has PyTorch's keys in TensorFlow too: wait (a payload's encoder to the
    collective's decoder) and compressor (its host functions' time) measured as a graph allows."""
    import hvd_gradq.tensorflow as gq
    from hvd_gradq.reduce.stats import Stats, flat_metrics

    comp = gq.from_spec("orq:levels=3", pattern="gather")
    run = tf.function(lambda *ts: _reduce(comp, hvd, ts))
    gs = [tf.constant(np.linspace(-1, 1, 3000, dtype=np.float32).reshape(60, 50)), tf.constant(np.ones(7, np.float32))]
    for _ in range(3):
        run(*gs)
    torch_like = Stats()  # PyTorch's kinds of time (the default)
    torch_like.begin_step()
    torch_like.decide("w", "gather", "requested", 3000, 1)
    torch_like.record("w", 1, 1)
    m = comp.metrics()
    assert set(m) == set(flat_metrics(torch_like.summary())), sorted(m)
    assert m["hvd_gradq/step"] == 3 and m["hvd_gradq/tensors_gather"] == 2
    assert m["hvd_gradq/encode_ms"] > 0 and m["hvd_gradq/decode_ms"] > 0 and m["hvd_gradq/wait_ms"] > 0, m
    assert m["hvd_gradq/compressor_ms"] == pytest.approx(m["hvd_gradq/encode_ms"] + m["hvd_gradq/decode_ms"])
    text = comp.summary()
    assert text.startswith("hvd_gradq: orq:levels=3 (pattern=gather), 1 rank on 1 host; ") and "3 steps" in text, text
    assert "  gather " in text and "in its host functions" in text, text


def test_compressor_compresses_when_horovod_torch_is_imported_too():
    """A process that imports horovod.torch as well as horovod.tensorflow: Horovod's shared
    process-set helper then asks torch's library, and ``global_process_set.included()`` says
    False on the only rank. Stock Horovod still reduces; the compressor once took that answer,
    passed every gradient through uncompressed and returned no context. It asks TensorFlow's
    own library (a fresh interpreter, so the imports come before ``hvd.init()``)."""
    # (not importorskip: importing horovod.torch here would put this very process in that state)
    code = """
import numpy as np, tensorflow as tf
import horovod.tensorflow as hvd, horovod.torch  # noqa: F401 (the second import is the point)
import hvd_gradq.tensorflow as gq
hvd.init()
assert not hvd.global_process_set.included()  # Horovod's own answer in this process
comp = gq.from_spec("orq:levels=3", pattern="gather", seed=1)
g = np.linspace(-1, 1, 600, dtype=np.float32)
def red(t):
    c, ctx = comp.compress(t)
    assert ctx is not None and ctx.pattern is not None
    return comp.decompress(hvd.allreduce(c, op=hvd.Average), ctx), ctx.result
out, payload = tf.function(red)(tf.constant(g))
assert payload.shape[0] > 0 and payload.shape[0] < 600, payload.shape
assert np.abs(out.numpy() - g).max() <= 1.0 + 1e-6
print("ok")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_compressor_traced_twice_keeps_one_set_of_state(hvd):
    import hvd_gradq.tensorflow as gq

    comp = gq.ORQ(levels=3, ef=True)
    made: list = []

    @tf.function
    def step(g1, g2):
        if not made:  # a variable created on the first trace makes tf.function trace twice
            made.append(tf.Variable(tf.zeros((5, 3))))
        outs, _ = _reduce(comp, hvd, [g1, g2])
        made[0].assign_add(outs[0])
        return outs

    for _ in range(3):
        step(tf.ones((5, 3)), tf.ones((4,)))
    assert [s["shape"] for s in comp.slots()] == [[5, 3], [4]]
    assert [s["steps"] for s in comp.slots()] == [3, 3]
    assert len(comp.residuals) == 2 and len(comp.steps) == 2
    # a different gradient list in the same position is refused, naming both shapes (AutoGraph,
    # when it converted the caller, re-raises it as a StagingError with the same message)
    with pytest.raises(GradqError, match=r"has shape \[2, 2\].*slot was made for \[5, 3\]"):
        tf.function(lambda g: _reduce(comp, hvd, [g]), autograph=False)(tf.ones((2, 2)))


def test_compressor_checkpoint_restores_exactly(hvd, tmp_path):
    import hvd_gradq.tensorflow as gq

    rng = np.random.default_rng(4)
    gs = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in [(40, 30), (9,)]]

    def fresh():
        comp = gq.QSGD(levels=2, ef=True)
        return comp, tf.function(lambda *ts: _reduce(comp, hvd, ts)[0])

    comp, run = fresh()
    for _ in range(3):
        run(*gs)
    path = tf.train.Checkpoint(compressor=comp).save(str(tmp_path / "c"))
    saved = [r.numpy() for r in comp.residuals.values()]
    after = [o.numpy() for o in run(*gs)]

    comp2, run2 = fresh()
    status = tf.train.Checkpoint(compressor=comp2).restore(path)
    again = [o.numpy() for o in run2(*gs)]  # slots are created by this trace, restored on creation
    status.assert_existing_objects_matched()
    assert [s["steps"] for s in comp2.slots()] == [4, 4]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(after, again))
    assert all(np.abs(s).max() > 0 for s in saved)


def test_compressor_nonfinite_policies(hvd):
    import hvd_gradq.tensorflow as gq

    with pytest.raises(GradqError, match="nonfinite=skip is not supported"):
        gq.from_spec("qsgd:nonfinite=skip")
    bad = np.ones(1100, np.float32)
    bad[600] = np.nan
    comp = gq.QSGD(nonfinite="raise")
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN/Inf"):
        tf.function(lambda t: _reduce(comp, hvd, [t])[0])(tf.constant(bad))
    comp = gq.QSGD()  # propagate, the default
    out = tf.function(lambda t: _reduce(comp, hvd, [t])[0])(tf.constant(bad))[0].numpy()
    assert np.isnan(out[512:1024]).all() and np.isfinite(out[:512]).all() and np.isfinite(out[1024:]).all()
    # a finite value beyond what the scheme quantizes in float32 (|x| < 2**127 at most) stops the
    # summable pattern under either policy, naming the magnitude, as in PyTorch
    huge = np.ones(1100, np.float32)
    huge[3] = 3e38
    for policy in ("raise", "propagate"):
        comp = gq.QSGD(nonfinite=policy, pattern="summable")
        with pytest.raises(tf.errors.InvalidArgumentError, match="this rank had a finite value of magnitude 3e"):
            tf.function(lambda t, comp=comp: _reduce(comp, hvd, [t])[0])(tf.constant(huge))


def test_compressor_fp16_overflow_raise_stops_after_the_gather(hvd):
    """fp16:overflow=raise: a value beyond 65504 makes the host encoder send the marked row
    (the poison, wire/poison.py) instead of raising before the allgather; decoding raises on every rank
    naming the ranks that sent one (here the only one). Patterns whose later phases start after
    a decode are refused with it, as with nonfinite=raise."""
    import hvd_gradq.tensorflow as gq

    big = np.ones(1100, np.float32)
    big[7] = 1e6
    comp = gq.from_spec("fp16:overflow=raise", pattern="gather")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rank\(s\) \[0\] had a finite value in this gradient"):
        tf.function(lambda t: _reduce(comp, hvd, [t])[0])(tf.constant(big))
    ok = tf.function(lambda t: _reduce(comp, hvd, [t])[0])(tf.constant(big / 1e3))[0].numpy()
    assert np.array_equal(ok, (big / 1e3).astype(np.float16).astype(np.float32))
    for pattern in ("scatter", "hierarchical"):
        with pytest.raises(GradqError, match=f"fp16:overflow=raise with pattern={pattern}"):
            gq.from_spec("fp16:overflow=raise", pattern=pattern)
        with pytest.raises(GradqError, match=f"nonfinite=raise with pattern={pattern}"):
            gq.from_spec("orq:nonfinite=raise", pattern=pattern)


def test_sparse_and_eager_paths(hvd):
    import hvd_gradq.tensorflow as gq

    comp = gq.QSGD()
    s = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([0, 4]), tf.constant([5, 3]))
    t, ctx = comp.compress(s)
    assert t is s and ctx is None and comp.decompress(t, None) is s
    eager = hvd.allreduce(tf.constant(np.arange(10, dtype=np.float32)), compression=gq.NoCompression())
    assert np.array_equal(eager.numpy(), np.arange(10, dtype=np.float32))
    with pytest.raises(GradqError, match="error feedback needs"):
        gq.Sign(ef=True).compress(tf.ones((3,)))


def test_factories_and_env(monkeypatch):
    import hvd_gradq.tensorflow as gq

    assert gq.ORQ(levels=5).scheme.spec == parse_scheme("orq:levels=5").spec
    assert gq.TopK(ratio=0.05, ef=True, seed=3).seed == 3
    for f in (gq.FP16, gq.Uniform, gq.QSGD, gq.TernGrad, gq.Sign, gq.TopK, gq.BinGrad, gq.ORQ):
        assert isinstance(f(), gq.GradqCompressor)
    monkeypatch.setenv("HVD_GRADQ", "bingrad:variant=pb,ef=true")
    assert gq.from_env().scheme.spec == parse_scheme("bingrad:variant=pb").spec
    assert gq.from_env().policy.ef
    with pytest.raises(GradqError):
        gq.from_spec("orq:levels=1")
    with pytest.raises(GradqError, match="pattern=summable"):
        gq.ORQ(pattern="summable")
    with pytest.raises(GradqError, match="name="):
        gq.ORQ(name="has space")
