"""hvd_gradq/torch/device_levels.py: ORQ-4/5's level search as torch ops over all buckets at once
chooses the host search's indices (hvd_gradq.kernels.search, the numba program and its Python
source) bit for bit on CPU tensors, and the device codec then encodes ORQ-4/5 and BinGrad-b
without handing a bucket to the host (Ops.host), with the host path's payload bytes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hvd_gradq import GradqError  # noqa: E402
from hvd_gradq.kernels.search import level_indices  # noqa: E402
from hvd_gradq.reduce import codec  # noqa: E402
from hvd_gradq.spec import parse_scheme  # noqa: E402
from hvd_gradq.torch import device, device_levels  # noqa: E402
from hvd_gradq.torch.ops import TorchOps  # noqa: E402


def _bucket(rng: np.random.Generator, kind: int, rows: int, w: int) -> np.ndarray:
    """Buckets of one kind: the shapes that make searches tie or cancel."""
    if kind == 0:
        x = rng.standard_normal((rows, w))
    elif kind == 1:  # heavy tails: a few points far out
        x = rng.standard_t(1.2, (rows, w))
    elif kind == 2:  # few distinct values: runs of equal points, exact ties between level sets
        x = rng.integers(-2, 3, (rows, w)).astype(np.float64)
    elif kind == 3:  # constant buckets
        x = np.full((rows, w), float(rng.standard_normal()))
    elif kind == 4:  # evenly spaced integers: symmetric, many equal-cost optima
        x = np.tile(np.arange(w, dtype=np.float64) - w // 3, (rows, 1))
        x = rng.permuted(x, axis=1)
    elif kind == 5:  # tiny and huge magnitudes
        x = rng.standard_normal((rows, w)) * 10.0 ** float(rng.integers(-30, 30))
    else:  # one-sided with an outlier
        x = np.abs(rng.standard_normal((rows, w)))
        x[:, 0] = 1e4
    return x.astype(np.float32)


@pytest.mark.parametrize("s", device_levels.LEVELS)
def test_indices_are_the_host_searchs(s: int) -> None:
    rng = np.random.default_rng(s)
    checked = 0
    for t in range(210):
        w = int(rng.integers(1, 9)) if t % 3 == 0 else int(rng.integers(9, 700))  # shorter than s too
        x = _bucket(rng, t % 7, int(rng.integers(1, 5)), w)
        ys = np.sort(x, axis=1).astype(np.float64)
        got = device_levels.level_indices(torch.from_numpy(ys), s).numpy()
        for compiled in (True, False) if t % 10 == 0 else (True,):
            want = level_indices(ys, s, compiled=compiled)
            assert np.array_equal(got, want), (t, w, compiled)
        checked += got.shape[0]
    assert checked > 400


def test_cpu_cumsum_adds_in_order() -> None:
    # the bit-identity rests on torch.cumsum adding one element after another, as the host does
    rng = np.random.default_rng(3)
    y = rng.standard_normal((3, 1000)) * 10.0 ** rng.integers(-8, 8, (3, 1000))
    want = np.empty_like(y)
    for r in range(3):
        a = 0.0
        for k in range(1000):
            a += float(y[r, k])
            want[r, k] = a
    assert torch.cumsum(torch.from_numpy(y), 1).numpy().tobytes() == want.tobytes()


def _no_host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def host(self: TorchOps, fn: Callable[..., Any], x: Any, shape: tuple[int, ...]) -> Any:
        calls.append(getattr(fn, "__name__", "?"))
        raise AssertionError("a bucket went to the host")

    monkeypatch.setattr(TorchOps, "host", host)
    return calls


@pytest.mark.parametrize("spec", ["orq:levels=4", "orq:levels=5", "orq:levels=5,clip=2.5", "orq:levels=4,scales=fp16",
                                  "orq:levels=5,bucket=64", "bingrad", "bingrad:bucket=100"])
def test_device_codec_keeps_buckets_on_the_device(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scheme = parse_scheme(spec)
    rng = np.random.default_rng(len(spec))
    want = {}
    for k, n in enumerate((1, 3, 700, 1300, 2049)):  # tails: n not a multiple of the bucket
        x = _bucket(rng, k, 1, n).reshape(-1)
        want[n] = (x, codec.encode(scheme, x, 5 + k, "t"))
    calls = _no_host(monkeypatch)
    for k, (n, (x, (hb, hown))) in enumerate(want.items()):
        got = device.encode(scheme, torch.from_numpy(x), 5 + k)
        assert got is not None
        assert got[0].tobytes() == hb.tobytes(), (spec, n)
        assert got[1].numpy().tobytes() == hown.tobytes(), (spec, n)
    assert calls == []


@pytest.mark.parametrize("spec", ["orq:levels=6", "bingrad:variant=pb"])
def test_the_other_searches_still_run_on_the_host(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _no_host(monkeypatch)
    with pytest.raises(AssertionError, match="went to the host"):
        device.encode(parse_scheme(spec), torch.randn(300), 0)
    assert len(calls) == 1


def test_bad_calls_say_what_to_do() -> None:
    ys = torch.zeros((2, 8), dtype=torch.float64)
    with pytest.raises(GradqError, match="levels 4 or 5"):
        device_levels.level_indices(ys, 6)
    with pytest.raises(GradqError, match="float64"):
        device_levels.level_indices(ys.float(), 4)
    with pytest.raises(GradqError, match="2-D"):
        device_levels.levels(torch.zeros(8), 5)
    assert device_levels.level_indices(torch.zeros((0, 8), dtype=torch.float64), 5).shape == (0, 5)
