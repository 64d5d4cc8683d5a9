"""Bytes on the wire: every payload is as long as its scheme says, and close to the theory
(log2 of the alphabet a symbol, plus the per-bucket scales)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hvd_gradq
from hvd_gradq.schemes.level import LevelScheme
from hvd_gradq.schemes.options import Scales
from hvd_gradq.spec import parse_scheme
from hvd_gradq.wire.packing import layout
from hvd_gradq.wire.payload import header_size

SCHEMES = [
    "none", "fp16", "uniform:bits=8", "uniform:bits=4", "uniform:bits=2", "uniform:bits=1",
    "qsgd:levels=1", "qsgd:levels=2", "qsgd:levels=4", "qsgd:levels=4,norm=l2", "terngrad", "sign",
    "topk:ratio=0.01", "topk:ratio=0.1,values=orq", "bingrad", "bingrad:variant=pb",
    "orq:levels=2", "orq:levels=3", "orq:levels=5", "orq:levels=9", "orq:levels=5,scales=fp16",
    "uniform:bits=8,scales=fp16,bucket=256",
]
BIG = 1 << 20


def _check_sizes(p: hvd_gradq.Payload, raw: bytes) -> None:
    n = p.n
    assert len(raw) == p.nbytes == header_size(p.scheme.spec, len(p.shape)) + p.scheme.nbytes(n)
    assert p.body_nbytes == p.scheme.nbytes(n)
    secs = p.scheme.sections(n)
    assert [s.name for s in secs] == sorted(p.parts, key=[s.name for s in secs].index)
    assert set(p.parts) == {s.name for s in secs}
    for s in secs:  # what the scheme produced has exactly the declared size
        assert np.asarray(p.parts[s.name]).size == s.count, s.name
    q = hvd_gradq.Payload.from_bytes(raw)
    assert sum(np.asarray(v).nbytes for v in q.parts.values()) == p.body_nbytes


@pytest.mark.parametrize("spec", SCHEMES)
def test_declared_sizes_are_real(spec):
    rng = np.random.default_rng(0)
    for n in (1, 7, 511, 512, 513, 5000, (1 << 14) + 37):
        x = rng.standard_normal(n).astype(np.float32)
        p = hvd_gradq.quantize(x, spec, seed=1)
        _check_sizes(p, p.to_bytes())


def _theory_bits_per_element(scheme) -> float:
    """Written out independently of the scheme's own code_bits."""
    if scheme.name == "none":
        return 32.0
    if scheme.name == "fp16":
        return 16.0
    if scheme.name == "topk":
        k = math.ceil(scheme.ratio * BIG)
        return (k * math.ceil(math.log2(BIG)) + k * _theory_bits_per_element(scheme.value_scheme)) / BIG
    assert isinstance(scheme, LevelScheme)
    meta_bits = 32 if scheme.scales is Scales.FP32 else 16
    return math.log2(scheme.symbols) + scheme.meta_width * meta_bits / scheme.bucket


@pytest.mark.parametrize("spec", [s for s in SCHEMES if s != "orq:levels=5,scales=fp16"])
def test_big_tensor_within_3_percent_of_theory(spec):
    scheme = parse_scheme(spec)
    x = np.random.default_rng(1).standard_normal(BIG).astype(np.float32)
    p = hvd_gradq.quantize(x, scheme, seed=2)
    raw = p.to_bytes()
    _check_sizes(p, raw)
    theory = scheme.code_bits(BIG)
    assert theory == pytest.approx(_theory_bits_per_element(scheme) * BIG, rel=1e-3)
    assert 8 * p.body_nbytes >= theory * (1 - 1e-9), "no packing beats log2 of the alphabet"
    got = 8 * p.body_nbytes / BIG
    assert 8 * p.body_nbytes <= theory * 1.03, f"{spec}: {got:.4f} bits/element vs {theory / BIG:.4f}"
    # the ratio against fp32 follows from the packing layout and the scales
    ratio = 4 * BIG / len(raw)
    if isinstance(scheme, LevelScheme):
        meta_bits = 32 if scheme.scales is Scales.FP32 else 16
        lay = layout(scheme.symbols)
        expected = 32 / (lay.bits / lay.group + scheme.meta_width * meta_bits / scheme.bucket)
        assert ratio == pytest.approx(expected, rel=0.002)


def test_paper_ratios():
    """ORQ-3 and ORQ-9 at log2(s) bits give 20.19 and 10.09 against fp32 on the codes alone;
    with base-s packing (1.6 and 3.2 bits) and 3 or 9 fp32 levels a bucket of 512 they give:"""
    for s, bits in ((3, 1.6), (5, 7 / 3), (9, 3.2)):
        p = hvd_gradq.quantize(np.random.default_rng(s).standard_normal(BIG // 8).astype(np.float32), f"orq:levels={s}")
        codes = p.parts["codes"].size * 8 / p.n
        assert codes == pytest.approx(bits, rel=1e-3)
        assert 32 / codes == pytest.approx(32 / math.log2(s), rel=0.01)  # within 1% of the paper's
        assert 4 * p.n / p.body_nbytes == pytest.approx(32 / (bits + s * 32 / 512), rel=1e-3)
    # one bit an element, less the two fp32 levels of a bucket: 32 / (1 + 1/8)
    p = hvd_gradq.quantize(np.ones(BIG // 8, np.float32), "bingrad")
    assert 4 * p.n / p.body_nbytes == pytest.approx(32 / 1.125, rel=1e-3)
