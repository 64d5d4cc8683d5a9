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
