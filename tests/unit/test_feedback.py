"""hvd_gradq.feedback.Memory: the error-feedback rule both frontends use, checked against plain
NumPy arithmetic written out here (and with torch tensors, PyTorch's store)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from stores import DictStore

from hvd_gradq.errors import GradqError
from hvd_gradq.feedback import Memory, parameter_of, reduced_key
from hvd_gradq.torch.ops import TorchOps
from hvd_gradq.torch.store import TensorStore, read_loss_scale
from hvd_gradq.xp import NUMPY


def test_rule_with_loss_scale_and_nonfinite() -> None:
    store = DictStore()
    m = Memory(NUMPY, store)
    g = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    m.begin_step(8.0)
    x = m.compensate("w", g)
    assert x is g  # no residual yet: the input itself
    dec = np.array([0.75, -2.0, np.inf, 2.0], np.float32)
    m.update("w", x, dec)
    # (x - dec) / 8, and 0 where that is not finite (there was no old residual)
    np.testing.assert_array_equal(store.d["w"], np.array([0.25 / 8, 0.0, 0.0, 1.0 / 8], np.float32))
    m.begin_step(4.0)  # the scale halved: the residual is added in the new units
    x2 = m.compensate("w", g)
    np.testing.assert_array_equal(x2, g + store.d["w"] * 4.0)
    old = store.d["w"].copy()
    keep = np.array([False, True, False, False])
    dec2 = np.array([np.nan, 0.0, 0.0, 0.0], np.float32)
    m.update("w", x2, dec2, keep=keep)
    want = (x2 - dec2) / 4.0
    want[0] = old[0]  # not finite: old stays
    want[1] = old[1]  # keep mask: old stays
    np.testing.assert_array_equal(store.d["w"], want)


def test_rollback_restores_and_forgets() -> None:
    store = DictStore()
    m = Memory(NUMPY, store)
    m.begin_step()
    m.update("a", np.ones(3, np.float32), np.zeros(3, np.float32))
    first = store.d["a"].copy()
    m.begin_step()
    m.update("a", np.full(3, 5.0, np.float32), np.zeros(3, np.float32))
    m.update("b", np.full(2, 1.0, np.float32), np.zeros(2, np.float32))
    m.update("a", np.full(3, 7.0, np.float32), np.zeros(3, np.float32))  # twice in one step: undo keeps the first old
    m.rollback()
    np.testing.assert_array_equal(store.d["a"], first)
    assert "b" not in store.d
    with pytest.raises(RuntimeError, match="keep="):
        Memory(NUMPY, DictStore(), undo=False).rollback()


def test_torch_store_matches_the_numpy_rule() -> None:
    rng = np.random.default_rng(0)
    g, dec = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    mn, mt = Memory(NUMPY, DictStore()), Memory(TorchOps("cpu"), TensorStore())
    for m, conv in ((mn, np.asarray), (mt, torch.from_numpy)):
        m.begin_step(2.0)
        x = m.compensate("k", conv(g))
        m.update("k", x, conv(dec))
        m.begin_step(2.0)
        m.update("k", m.compensate("k", conv(g)), conv(dec))
    np.testing.assert_array_equal(mn.store.d["k"], mt.store.residuals["k"].numpy())  # type: ignore[attr-defined]


def test_keys_and_loss_scale_reader() -> None:
    assert reduced_key("fc.weight") == "fc.weight#reduce"
    assert parameter_of(reduced_key("fc.weight")) == "fc.weight" and parameter_of("x#1") == "x#1"
    assert read_loss_scale(None) is None and read_loss_scale(lambda: 1024) == 1024.0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(GradqError, match="positive finite"):
            read_loss_scale(lambda b=bad: b)


class _FrameworkOps(TorchOps):
    """torch's operations only: no host views, so Memory runs the rule as framework operations
    (the oracle of the compiled passes, which share no code with it)."""

    def host_view(self, x: object) -> None:
        return None


def _steps(ops: TorchOps, n: int, seed: int) -> list[torch.Tensor]:
    """Five steps of the rule on ``n`` elements (scales, NaN/Inf, keep masks, an undone step),
    returning every residual written, copied."""
    rng = np.random.default_rng(seed)
    store = TensorStore()
    m = Memory(ops, store)
    seen = []
    for step, scale in enumerate([None, 1024.0, 512.0, 2.0**-3, 65536.0]):
        m.begin_step(scale)
        g = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 10.0 ** rng.integers(-3, 3))
        x = m.compensate("w", g)
        dec = (x + torch.from_numpy(rng.standard_normal(n).astype(np.float32))).contiguous()
        dec[rng.integers(0, n, 3)] = float("nan")
        dec[rng.integers(0, n, 2)] = float("inf")
        keep = torch.from_numpy(rng.random(n) < 0.1) if step % 2 else None
        m.update("w", x, dec, keep=keep)
        m.update("w#reduce", x[: n // 2].contiguous(), dec[: n // 2].contiguous())
        if step == 3:
            m.rollback()  # a skipped step: the residuals of step 2 are back, and step 4 starts from them
        seen += [store.residuals["w"].clone(), store.residuals["w#reduce"].clone(), x.clone()]
    return seen


@pytest.mark.parametrize("n", [1, 1000, 300_001])  # 300,001: split over two threads' ranges
def test_compiled_rule_is_the_framework_rule_bit_for_bit(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_THREADS", "2")
    want = _steps(_FrameworkOps("cpu"), n, n)
    got = _steps(TorchOps("cpu"), n, n)
    for w, g in zip(want, got):
        assert torch.equal(w.view(torch.int32), g.view(torch.int32))  # bits, NaN and signed zeros included



def test_compiled_rule_holds_nothing_from_earlier_steps() -> None:
    # the compiled rule writes each residual into the buffer of the step before last; what it
    # stores must be that buffer itself. A tensor made by torch.from_numpy of a tensor's NumPy
    # view holds that view, whose base holds the older storage: wrapping each step's view chains
    # every step's wrappers (~200 bytes a tensor a step, found by the long-run memory test)
    import tracemalloc

    store = TensorStore()
    mem = Memory(TorchOps("cpu"), store, undo=True)
    x = torch.linspace(-1.0, 1.0, 257)

    def step() -> None:
        mem.begin_step(None)
        y = mem.compensate("w", x)
        mem.update("w", y, torch.sign(y) * 0.5)

    for _ in range(20):  # first calls: compiled kernels' dispatch, the spare buffers
        step()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(500):
            step()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert grown < 10_000, f"{grown} bytes more held after 500 steps of one tensor"  # a chain: ~100,000
    e = torch.zeros_like(x)  # the values are still the rule's: y = x + e, e = y - sign(y)/2
    for _ in range(520):
        y = x + e
        e = y - torch.sign(y) * 0.5
    assert torch.allclose(store.residuals["w"].reshape(-1), e, atol=1e-6)


@pytest.mark.parametrize("scale", [None, 8.0])
def test_flush_delivers_every_residual_once_on_its_slice_and_rollback_restores_them(scale: float | None) -> None:
    """A step sent uncompressed (auto's measured plan) carries the tensor's own residual and each
    owner residual on the slice it belongs to, in the step's loss-scale units; then none is held.
    A skipped step (rollback) puts them back as they were."""
    for ops, store in ((NUMPY, DictStore()), (TorchOps("cpu"), TensorStore())):
        m = Memory(ops, store)
        arr = (lambda a: a) if ops is NUMPY else torch.from_numpy
        own = np.arange(10, dtype=np.float32) / 7
        owner = np.array([0.5, -0.25, 0.125], np.float32)
        store.write("w", arr(own.copy()))
        store.write(reduced_key("w"), arr(owner.copy()))
        m.begin_step(scale)
        g = np.linspace(-1, 1, 10, dtype=np.float32)
        out = np.asarray(m.flush("w", arr(g.copy()), [(reduced_key("w"), 4, 7)]))
        s = 1.0 if scale is None else scale
        want = g.astype(np.float64) + own * s
        want[4:7] += owner * s
        np.testing.assert_allclose(out, want, rtol=1e-6)
        assert store.read("w", arr(g)) is None and store.read(reduced_key("w"), arr(g[4:7])) is None
        m.rollback()
        np.testing.assert_array_equal(np.asarray(store.read("w", arr(g))), own)
        np.testing.assert_array_equal(np.asarray(store.read(reduced_key("w"), arr(g[4:7]))), owner)
        x = arr(g.copy())
        assert m.flush("other", x) is x  # nothing held: the tensor itself, no copy
