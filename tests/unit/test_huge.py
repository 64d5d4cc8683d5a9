"""2**27 elements (issue: hardening): no int32 overflow in offsets, packing, checksums or the
header. Runs the compiled fast paths (the default); the NumPy reference shares the packing layout
and the framing but takes minutes at this size, so ``test_degenerate.py`` covers it on small input."""

from __future__ import annotations

import numpy as np
import pytest

import hvd_gradq

HUGE = 1 << 27  # 512 MiB of float32: element offsets x 4 bytes pass 2**31, codes offsets pass 2**26


@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec,period", [("uniform:bits=4", 16), ("uniform:bits=8", 256), ("sign", 2)])
def test_two_to_the_27_elements(spec: str, period: int) -> None:
    """Every bucket of 512 holds the same values, and the schemes here are deterministic, so
    every bucket must decode to the same values, close to the input: a single misplaced code or
    bucket anywhere, the last ones included, shows as a difference."""
    idx = np.arange(HUGE, dtype=np.int64)
    if spec == "sign":
        x = np.where((idx // 512) % 2 == 0, 1.0, -1.0).astype(np.float32)  # constant-sign buckets of +-1
    else:
        x = (idx % period).astype(np.float32)  # each bucket: 0 .. period-1, repeated
    del idx
    p = hvd_gradq.quantize(x, spec, seed=3)
    raw = p.to_bytes()
    assert len(raw) == p.nbytes and p.nbytes < x.nbytes
    q = hvd_gradq.Payload.from_bytes(raw)
    assert q.n == HUGE and q.shape == (HUGE,)
    y = hvd_gradq.dequantize(q).reshape(-1, 512)
    if spec == "sign":
        y = y * np.where(np.arange(y.shape[0]) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None]
    first = y[0].copy()
    np.testing.assert_allclose(first, np.abs(x[:512]), atol=0.5 if spec != "sign" else 0.0)
    bad = np.flatnonzero((y != first).any(axis=1))
    assert bad.size == 0, f"{bad.size} buckets differ from bucket 0, first ones {bad[:5]}"
    # and a flipped byte near the end of 2**27 elements' codes is caught by the checksum
    flipped = bytearray(raw)
    flipped[-3] ^= 0x10
    with pytest.raises(hvd_gradq.PayloadError):
        hvd_gradq.Payload.from_bytes(bytes(flipped))
