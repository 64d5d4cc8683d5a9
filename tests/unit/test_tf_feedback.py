"""TensorFlow's error feedback as host ops (:class:`hvd_gradq.feedback.Memory` with ``TFOps.host_op``):
the compiled passes against the graph-op rule they replace (``feedback.Classic`` as TF operations),
bit for bit, eagerly and inside ``tf.function``: loss scales as traced tensors, NaN/Inf, keep
masks, a result's NaN, warm-up holds, another rank's residual, a padded owner variable and
subnormals (TF's kernels flush them; the host passes must too)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hvd_gradq.errors import GradqError  # noqa: E402
from hvd_gradq.feedback import Memory  # noqa: E402
from hvd_gradq.kernels import _switch  # noqa: E402
from hvd_gradq.tensorflow.ops import HOST_OP_MIN, HOST_OP_MIN_ENV, TFOps  # noqa: E402
from hvd_gradq.tensorflow.store import SlotStore  # noqa: E402

TINY = np.finfo(np.float32).tiny
# 2**100 first: tiny differences of tiny gradients become subnormal residuals (flushed by TF)
SCALES = [2.0**100, None, 1024.0, 512.0, 2.0**-3, 65536.0]


class _GraphOps(TFOps):
    """TensorFlow's operations only: Memory runs the rule as graph ops (today's path, the oracle)."""

    host_op = None


class _HostOps(TFOps):
    """The host ops for tensors of every size (by default only from HOST_OP_MIN elements)."""

    def host_op_min(self) -> int:
        return 0


class _NoFlush(_HostOps):
    """The host passes without TensorFlow's subnormal rule: what the test data must tell apart."""

    flushes_subnormals = False


def _store(n: int) -> tuple[SlotStore, dict]:
    """A SlotStore (rank 0) with a slot ``w`` of ``n`` (restored with subnormals and tiny values),
    an owner variable ``w#reduce`` wider than the ``n // 2`` elements written to it (padded, as
    the scatter pattern's), and ``o``, a residual restored from rank 1 (zero until written here)."""
    rng = np.random.default_rng(n + 1)
    first = (rng.standard_normal(n) * 10.0 ** rng.integers(-41, -30, n)).astype(np.float32)
    res = {"w": tf.Variable(first), "w#reduce": tf.Variable(np.zeros(n // 2 + 3, np.float32)),
           "o": tf.Variable(np.full(n, 0.25, np.float32))}
    owners = {"w": tf.Variable(np.int64(0)), "w#reduce": tf.Variable(np.int64(0)), "o": tf.Variable(np.int64(1))}
    return SlotStore(res, owners, 0), res


def _inputs(n: int, seed: int) -> list[dict]:
    """Per step: the gradient ``g``, the decoded values' offset from what was sent (NaN, Inf and
    tiny ones included), keep mask, reduced result (NaN at two steps), hold, scale."""
    rng = np.random.default_rng(seed)
    steps = []
    for step, scale in enumerate(SCALES):
        g = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3))
        off = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-4, 0))
        small = rng.random(n) < 0.2
        g[small] = np.float32(1e-7)  # with off ~1e-12: differences that divide into subnormals
        off[small] = (rng.standard_normal(int(small.sum())) * 1e-12).astype(np.float32)
        g[rng.integers(0, n, 2)] = np.float32(3e-39)  # subnormal gradients: zeros to TF (DAZ)
        g[rng.integers(0, n, 1)] = -0.0
        off[rng.integers(0, n, 3)] = np.nan
        off[rng.integers(0, n, 2)] = np.inf
        result = rng.standard_normal(n).astype(np.float32)
        if step in (2, 4):
            result[rng.integers(0, n, 2)] = np.nan
        steps.append({"g": g, "off": off, "result": None if step == 0 else result,
                      "keep": rng.random(n) < 0.1 if step % 2 else None,
                      "hold": None if step < 2 else step == 3, "scale": scale})
    return steps


def _step(mem: Memory, g: object, off: object, result: object, scale: object, hold: object, keep: object) -> list:
    """One step of the three residuals: compensate, decode (``x + off``), update."""
    mem.begin_step(scale)
    x = mem.compensate("w", g)
    dec = x + off
    mem.update("w", x, dec, keep=keep, result=result, hold=hold)
    h = int(x.shape[0]) // 2
    xr = mem.compensate("w#reduce", x[:h])
    mem.update("w#reduce", xr, dec[:h])
    xo = mem.compensate("o", g)
    mem.update("o", xo, dec)
    return [x, xr, xo]


def _run(ops: TFOps, n: int, graph: bool) -> list[np.ndarray]:
    """Every step's outputs and residual variables, eagerly or each step a ``tf.function`` call
    (scale and hold traced inputs, as a LossScaleOptimizer's scale and a warm-up cond's are)."""
    store, res = _store(n)
    mem = Memory(ops, store, undo=False)
    seen = []
    step = tf.function(lambda *a: _step(mem, *a)) if graph else lambda *a: _step(mem, *a)
    for s in _inputs(n, n):
        args = [None if s[k] is None else tf.constant(s[k], tf.float32 if k == "scale" else None)
                for k in ("g", "off", "result", "scale", "hold", "keep")]
        seen += [np.asarray(t) for t in step(*args)] + [res[k].numpy() for k in ("w", "w#reduce", "o")]
    return seen


def _same_bits(want: list[np.ndarray], got: list[np.ndarray]) -> None:
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got)):
        assert w.shape == g.shape
        bad = np.flatnonzero(w.view(np.int32) != g.view(np.int32))  # bits: NaN, signed zeros, subnormals
        assert bad.size == 0, f"array {i}: {bad.size} elements differ, first {bad[:5]}: {w[bad[:5]]} vs {g[bad[:5]]}"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("n", [1, 1000, 300_001])  # 300,001: split over two threads' ranges
def test_host_ops_are_the_graph_rule_bit_for_bit(n: int, graph: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_THREADS", "2")
    want = _run(_GraphOps(), n, graph)
    got = _run(_HostOps(), n, graph)
    _same_bits(want, got)
    w = want[3::6]  # residual "w" after each step: it moved, and step 3 (hold) kept it whole
    assert np.array_equal(w[3], w[2]) and (n == 1 or not np.array_equal(w[1], w[0]))


def test_the_data_needs_the_subnormal_rule() -> None:
    # eagerly the host pass runs on this thread, without the FTZ/DAZ bits TF's executor threads
    # set: without flushing by hand its bits differ from TF's, so the data above exercises it
    want = _run(_GraphOps(), 1000, False)
    got = _run(_NoFlush(), 1000, False)
    assert any(not np.array_equal(w.view(np.int32), g.view(np.int32)) for w, g in zip(want, got))


def test_numpy_fallback_is_the_graph_rule_bit_for_bit() -> None:
    # without the compiled kernels the passes are NumPy expressions: they flush subnormals too
    want = _run(_GraphOps(), 1000, False)
    with _switch.disabled():
        got = _run(_HostOps(), 1000, False)
    _same_bits(want, got)


def test_the_function_runs_one_host_op_a_pass_and_no_graph_rule() -> None:
    # what the change is for: compensate and update of a tensor as host ops, not the rule's chain
    s = _inputs(64, 1)[3]  # a keep mask and a result

    def ops_of(ops: TFOps) -> list[str]:
        store, _ = _store(64)
        mem = Memory(ops, store, undo=False)
        f = tf.function(lambda scale, hold: _step(mem, tf.constant(s["g"]), tf.constant(s["off"]),
                                                  tf.constant(s["result"]), scale, hold, tf.constant(s["keep"])))
        graph = f.get_concrete_function(tf.TensorSpec((), tf.float32), tf.TensorSpec((), tf.bool)).graph
        return [op.type for op in graph.get_operations()]

    new, old = ops_of(_HostOps()), ops_of(_GraphOps())
    assert new.count("PyFuncStateless") == 6  # three keys, two passes each
    assert not {"IsFinite", "RealDiv", "Mul", "SelectV2", "LogicalOr"} & set(new)
    assert "PyFuncStateless" not in old and {"IsFinite", "RealDiv", "Mul", "SelectV2", "LogicalOr"} <= set(old)


def test_off_the_cpu_or_not_float32_the_graph_rule_stays() -> None:
    ops = TFOps()
    assert ops.on_host(tf.zeros(3)) and not ops.on_host(tf.zeros(3, tf.float64))
    with tf.Graph().as_default():
        with tf.device("/device:GPU:0"):
            assert not ops.on_host(tf.zeros(3))
        with tf.device("/device:CPU:0"):
            assert ops.on_host(tf.zeros(3))


def test_host_ops_from_host_op_min_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    # below the size where a host op's fixed cost is paid back, TF's operations stay
    def host_ops(n: int) -> int:
        store = SlotStore({"w": tf.Variable(np.zeros(n, np.float32))}, {"w": tf.Variable(np.int64(0))}, 0)
        mem = Memory(TFOps(), store, undo=False)
        f = tf.function(lambda g: mem.update("w", mem.compensate("w", g), g))
        graph = f.get_concrete_function(tf.TensorSpec((n,), tf.float32)).graph
        return [op.type for op in graph.get_operations()].count("PyFuncStateless")

    assert TFOps().host_op_min() == HOST_OP_MIN and host_ops(HOST_OP_MIN - 1) == 0 and host_ops(HOST_OP_MIN) == 2
    monkeypatch.setenv(HOST_OP_MIN_ENV, "0")
    assert host_ops(5) == 2
    for bad in ("-1", "lots"):
        monkeypatch.setenv(HOST_OP_MIN_ENV, bad)
        with pytest.raises(GradqError, match=HOST_OP_MIN_ENV):
            TFOps().host_op_min()
