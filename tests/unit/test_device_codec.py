"""hvd_gradq/torch/device.py: encoding and decoding on the tensor's device (run here on CPU
tensors, the same code a CUDA tensor takes) gives the host path's bytes and sums, bit for bit;
Top-K keeps the same elements everywhere when magnitudes tie (``hvd_gradq.xp.TOPK_TIES``)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hvd_gradq import GradqError  # noqa: E402
from hvd_gradq.api import split  # noqa: E402
from hvd_gradq.reduce import codec  # noqa: E402
from hvd_gradq.spec import parse_scheme  # noqa: E402
from hvd_gradq.torch import device  # noqa: E402

SPECS = ["none", "fp16", "uniform:bits=4", "uniform:bits=8,bucket=128", "qsgd:levels=4", "qsgd:levels=1,norm=l2",
         "terngrad", "sign", "topk:ratio=0.05", "bingrad", "bingrad:variant=pb", "orq:levels=3", "orq:levels=5",
         "orq:levels=9,clip=2.5", "orq:levels=5,scales=fp16"]


@pytest.mark.parametrize("spec", SPECS)
def test_device_bytes_and_sums_are_the_host_paths(spec: str) -> None:
    scheme = parse_scheme(spec)
    rng = np.random.default_rng(len(spec))
    xs = [rng.standard_t(3, 1300).astype(np.float32) for _ in range(3)]
    host = [codec.encode(scheme, x, 11 + r, "t") for r, x in enumerate(xs)]
    dev = [device.encode(scheme, torch.from_numpy(x), 11 + r) for r, x in enumerate(xs)]
    for (hb, hown), got in zip(host, dev):
        assert got is not None
        db, down = got
        assert db.tobytes() == hb.tobytes(), spec
        assert down.numpy().tobytes() == hown.tobytes(), spec
    gathered = np.concatenate([h[0] for h in host])
    want, n = codec.decode_sum(gathered, 1, host[1][1], "t")
    got_sum, m = device.decode_sum(gathered, 1, dev[1][1], "t")  # type: ignore[index]
    assert n == m == 3 and got_sum.numpy().tobytes() == want.tobytes(), spec


def test_values_the_device_path_leaves_to_the_host() -> None:
    scheme = parse_scheme("orq:levels=5")
    x = torch.randn(600)
    x[7] = float("nan")
    assert device.encode(scheme, x, 0) is None  # the host path applies nonfinite=
    x[7] = 3e38
    assert device.encode(scheme, x, 0) is None  # beyond the scheme's float32 range


def test_codec_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device.ENV, raising=False)
    assert device.resolve_codec(None) == "auto" and device.resolve_codec("host") == "host"
    monkeypatch.setenv(device.ENV, "device")
    assert device.resolve_codec(None) == "device"
    cpu = torch.zeros(3)
    assert device.on_device("device", cpu) and not device.on_device("auto", cpu) and not device.on_device("host", cpu)
    with pytest.raises(GradqError, match="auto, host, device"):
        device.resolve_codec("gpu")


def _ties() -> dict[str, np.ndarray]:
    """Gradients whose magnitudes tie at the k-th place: what fp16/bf16 training produces."""
    rng = np.random.default_rng(5)
    pairs = rng.integers(1, 6, 1200).astype(np.float32)
    return {
        "fp16-valued": rng.standard_normal(4000).astype(np.float16).astype(np.float32),
        "bf16-valued": (rng.standard_normal(3000).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32),
        "all-equal": np.full(2500, 0.25, np.float32),
        "+x/-x pairs": np.stack([pairs, -pairs], 1).reshape(-1),
        "few levels, zeros": rng.integers(-2, 3, 3100).astype(np.float32),
    }


def _oracle_topk(x: np.ndarray, k: int) -> np.ndarray:
    """The tie rule, independently: sort by (-|x|, index), keep the first k, ascending."""
    return np.sort(np.lexsort((np.arange(x.shape[0]), -np.abs(x.astype(np.float64))))[:k])


@pytest.mark.parametrize("case", list(_ties()))
def test_topk_ties_follow_one_rule_in_every_namespace(case: str) -> None:
    from hvd_gradq.torch.ops import TorchOps
    from hvd_gradq.xp import NUMPY

    x = _ties()[case]
    n = x.shape[0]
    for k in sorted({1, 2, n // 100, n // 7, n // 2, n - 1, n}):
        want = _oracle_topk(x, k)
        got_np = NUMPY.topk_abs(x, k)
        got_torch = TorchOps("cpu").topk_abs(torch.from_numpy(x), k).numpy()
        assert got_np.dtype == got_torch.dtype == np.int64
        assert np.array_equal(got_np, want), (case, k)
        assert np.array_equal(got_torch, want), (case, k)


@pytest.mark.parametrize("case", list(_ties()))
@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "topk:ratio=0.3,values=none", "topk:ratio=0.05,values=orq"])
def test_topk_device_bytes_equal_the_hosts_when_magnitudes_tie(case: str, spec: str) -> None:
    from hvd_gradq.schemes.topk import index_bits
    from hvd_gradq.wire.packing import unpack_bits
    from hvd_gradq.xp import NUMPY

    scheme = parse_scheme(spec)
    x = _ties()[case]
    hb, hown = codec.encode(scheme, x, 3, "t")
    got = device.encode(scheme, torch.from_numpy(x), 3)
    assert got is not None
    db, down = got
    assert db.tobytes() == hb.tobytes(), (case, spec)
    assert down.numpy().tobytes() == hown.tobytes(), (case, spec)
    # the payload keeps the rule's elements: its indices are the oracle's
    p = split(hb)[0]
    n, k = x.shape[0], scheme.kept(x.shape[0])
    idx = unpack_bits(NUMPY, p.parts["indices"].astype(np.int64), index_bits(n), k)
    assert np.array_equal(np.asarray(idx), _oracle_topk(x, k)), (case, spec)


def test_topk_ties_in_tensorflow_follow_the_rule() -> None:
    tf = pytest.importorskip("tensorflow")
    from hvd_gradq.tensorflow.ops import TF

    for case, x in _ties().items():
        n = x.shape[0]
        for k in (1, n // 7, n - 1):
            want = _oracle_topk(x, k)
            eager = TF.topk_abs(tf.constant(x), k).numpy()
            traced = tf.function(lambda t, k=k: TF.topk_abs(t, k))(tf.constant(x)).numpy()
            assert np.array_equal(eager, want) and np.array_equal(traced, want), (case, k)
