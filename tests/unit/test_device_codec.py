"""hvd_gradq/torch/device.py: encoding and decoding on the tensor's device (run here on CPU
tensors, the same code a CUDA tensor takes) gives the host path's bytes and sums, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hvd_gradq import GradqError, parse  # noqa: E402
from hvd_gradq.frontend import codec  # noqa: E402
from hvd_gradq.torch import device  # noqa: E402

SPECS = ["none", "fp16", "uniform:bits=4", "uniform:bits=8,bucket=128", "qsgd:levels=4", "qsgd:levels=1,norm=l2",
         "terngrad", "sign", "topk:ratio=0.05", "bingrad", "bingrad:variant=pb", "orq:levels=3", "orq:levels=5",
         "orq:levels=9,clip=2.5", "orq:levels=5,scales=fp16"]


@pytest.mark.parametrize("spec", SPECS)
def test_device_bytes_and_sums_are_the_host_paths(spec: str) -> None:
    scheme = parse(spec)
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
    scheme = parse("orq:levels=5")
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
