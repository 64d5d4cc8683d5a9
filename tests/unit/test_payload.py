"""The wire format (hvd_gradq/wire/payload.py): bit-exact round trips and refusal of bad bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvd_gradq
from hvd_gradq import wire as pl
from hvd_gradq.api import split
from hvd_gradq.errors import PayloadError
from hvd_gradq.spec import parse_scheme
from hvd_gradq.wire.packing import layout

SCHEMES = [
    "none",
    "fp16",
    "uniform:bits=8",
    "uniform:bits=4,scales=fp16",
    "qsgd:levels=1",
    "qsgd:levels=4,norm=l2",
    "terngrad",
    "sign",
    "topk",
    "topk:values=orq,ratio=0.1",
    "bingrad",
    "bingrad:variant=pb",
    "orq:levels=3",
    "orq:levels=9",
    "orq:levels=5,bucket=64",
]
SHAPES = [(), (0,), (1,), (7,), (600,), (3, 5, 41), (2, 0, 3)]
DTYPES = [np.float16, np.float32, np.float64]


def _data(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def reseal(buf: bytes | bytearray) -> bytes:
    """Recompute the checksum field, so an edit reaches the checks behind the checksum."""
    a = np.frombuffer(bytes(buf), np.uint8).copy()
    if a.size < pl.CHECK_OFFSET + 4:
        return bytes(a)
    a[pl.CHECK_OFFSET : pl.CHECK_OFFSET + 4] = 0
    a[pl.CHECK_OFFSET : pl.CHECK_OFFSET + 4] = np.frombuffer(struct.pack("<I", pl.checksum(a)), np.uint8)
    return bytes(a)


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("spec", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_round_trip_bit_exact(spec, dtype):
    for i, shape in enumerate(SHAPES):
        x = _data(shape, dtype, i)
        p = hvd_gradq.quantize(x, spec, seed=11)
        raw = p.to_bytes()
        assert len(raw) == p.nbytes
        q = hvd_gradq.Payload.from_bytes(raw)
        assert q.scheme == p.scheme and q.shape == x.shape and q.dtype == np.dtype(dtype).name
        assert q.to_bytes() == raw
        assert set(q.parts) == set(p.parts)
        for k in p.parts:  # (quantize may hold a section wider than its wire dtype: fp16 scales)
            assert q.parts[k].tobytes() == np.asarray(p.parts[k]).astype(q.parts[k].dtype).tobytes(), k
        # also from a uint8 array, as an allgather hands it over
        assert hvd_gradq.Payload.from_bytes(np.frombuffer(raw, np.uint8)).to_bytes() == raw
        y1, y2 = hvd_gradq.dequantize(p), hvd_gradq.dequantize(q)
        assert y1.shape == x.shape and y1.dtype == x.dtype
        assert _same_array(y1, y2)


def test_header_layout_is_as_documented():
    x = _data((4, 6), np.float64)
    p = hvd_gradq.quantize(x, "orq:levels=3")
    raw = p.to_bytes()
    magic, version, dcode, ndim, flags, total, check, speclen = struct.unpack("<4sBBBBQIH", raw[:22])
    assert (magic, version, ndim, flags, total) == (b"HVGQ", 3, 2, 0, len(raw))
    assert pl.DTYPES[dcode] == "float64"
    assert struct.unpack("<2Q", raw[22:38]) == (4, 6)
    assert raw[38 : 38 + speclen].decode() == p.scheme.spec == "orq:levels=3"  # non-defaults only
    # the checksum, written out independently: CRC-32 (reflected 0xEDB88320, zlib's) of the
    # payload with the check field zeroed
    zeroed = raw[:16] + b"\0\0\0\0" + raw[20:]
    assert check == _crc32_bitwise(zeroed)
    # sections follow in the scheme's order with their exact sizes
    body = raw[38 + speclen :]
    assert len(body) == p.body_nbytes == sum(s.nbytes for s in p.scheme.sections(24))


def _crc32_bitwise(data: bytes) -> int:
    """CRC-32 (IEEE 802.3, as zlib computes it), one bit at a time: the definition, no table."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _weighted_v2(data: bytes) -> int:
    """Version 2's checksum, kept here to show what it missed: sum(byte_i * (1 + i mod 65521)) mod 2**32."""
    return sum(b * (1 + i % 65521) for i, b in enumerate(data)) % (1 << 32)


def test_errors_that_cancel_under_the_old_weighted_sum_are_caught_by_the_crc():
    """Issue 35, item 7: +2 at the byte of weight w, -1 at the byte of weight 2w leaves the
    version-2 weighted sum unchanged (2w - 2w = 0); CRC-32 catches it, and catches every one
    of a sample of such pairs, bit flips included (+2 and -1 by flipping bit 1 of a byte that
    has it clear, and bit 0 of one that has it set)."""
    raw = bytearray(hvd_gradq.quantize(_data((5000,), np.float32), "orq:levels=5", seed=3).to_bytes())
    hlen = 33
    rng = np.random.default_rng(7)
    pairs = 0
    for _ in range(2000):
        a = int(rng.integers(hlen, (len(raw) - 1) // 2))  # weight a + 1; weight 2(a + 1) at byte 2a + 1
        b = 2 * a + 1
        if raw[a] & 2 or not raw[b] & 1:
            continue
        bad = bytearray(raw)
        bad[a] ^= 2  # +2
        bad[b] ^= 1  # -1
        zeroed, bad_zeroed = (bytes(x[:16]) + bytes(4) + bytes(x[20:]) for x in (raw, bad))
        assert _weighted_v2(bad_zeroed) == _weighted_v2(zeroed)  # passed the old check (failing before)
        with pytest.raises(PayloadError, match="CRC-32"):  # refused now (passing after)
            hvd_gradq.Payload.from_bytes(bytes(bad))
        pairs += 1
    assert pairs > 200


def _with_spec(raw: bytes, text: str, version: int = pl.VERSION) -> bytes:
    """``raw``'s payload with its header rewritten to name ``text`` (and ``version``), resealed."""
    p = hvd_gradq.Payload.from_bytes(raw)
    body = raw[pl.header_size(p.scheme.spec, len(p.shape)):]
    head = bytearray(pl.header_bytes(text, p.dtype, p.shape, pl.header_size(text, len(p.shape)) + len(body)))
    head[4] = version
    return reseal(bytes(head) + body)


#: Every scheme's defaults, as a version-3 header leaves them out (version 2's: version 3 changed
#: the checksum alone). Changing one changes what a header means (``orq`` would decode with
#: other levels): it needs a new wire.payload.VERSION.
DEFAULTS_V3 = {
    "bingrad": "bucket=512,clip=0.0,scales=fp32,variant=b",
    "fp16": "bucket=512,overflow=inf",
    "none": "bucket=512",
    "orq": "bucket=512,clip=0.0,scales=fp32,levels=5",
    "qsgd": "bucket=512,clip=0.0,scales=fp32,levels=4,norm=max",
    "sign": "bucket=512,clip=0.0,scales=fp32",
    "terngrad": "bucket=512,clip=2.5,scales=fp32",
    "topk": "bucket=512,ratio=0.01,values=fp16",
    "uniform": "bucket=512,clip=0.0,scales=fp32,bits=8,rounding=nearest",
}


def test_the_defaults_a_header_leaves_out_are_pinned_to_the_version():
    import dataclasses

    from hvd_gradq.spec import names, scheme_class

    assert pl.VERSION == 3, "a new version: write its own table of defaults"
    got = {}
    for name in names():
        fields = [f for f in dataclasses.fields(scheme_class(name)) if f.init]
        got[name] = ",".join(f"{f.name}={getattr(f.default, 'value', f.default)}" for f in fields)
        # spelled out, the defaults name the scheme whose header is the name alone
        assert parse_scheme(f"{name}:{DEFAULTS_V3[name]}").spec == name
    assert got == DEFAULTS_V3


def test_header_of_a_512_element_orq5_payload_is_33_bytes_not_112():
    p = hvd_gradq.quantize(_data((512,), np.float32), "orq")
    raw = p.to_bytes()
    speclen = struct.unpack("<H", raw[20:22])[0]
    assert raw[30 : 30 + speclen] == b"orq" and pl.header_size(p.scheme.spec, 1) == 33
    assert len(raw) == 33 + p.body_nbytes == 207
    # version 1 named every parameter and the policy: 22 + 8 + 82 bytes
    v1 = "orq:bucket=512,ef=false,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,levels=5"
    assert pl.header_size(v1, 1) == 112
    # the policy (ef, warmup, nonfinite) changes no byte of a payload
    for spec in ("orq:ef=true", "orq:warmup=5,nonfinite=raise"):
        assert hvd_gradq.quantize(_data((512,), np.float32), spec).to_bytes() == raw


def test_a_version_1_payload_is_refused_saying_what_it_is_and_what_to_do():
    raw = hvd_gradq.quantize(_data((512,), np.float32), "orq").to_bytes()
    v1 = _with_spec(raw, "orq:bucket=512,ef=false,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,levels=5", 1)
    with pytest.raises(PayloadError) as e:
        hvd_gradq.Payload.from_bytes(v1)
    msg = str(e.value)
    assert msg.startswith("payload version 1: written by an older hvd_gradq")
    assert "reads version 3 only" in msg and "Re-encode the tensor with this version (hvd_gradq.quantize)" in msg


def test_a_version_2_payload_is_refused_saying_what_it_is_and_what_to_do():
    """Version 2 had this layout and the weighted checksum: refused, even with a valid CRC."""
    raw = hvd_gradq.quantize(_data((512,), np.float32), "orq").to_bytes()
    v2 = _with_spec(raw, "orq", 2)
    assert v2[5:16] == raw[5:16] and v2[20:] == raw[20:]  # the version byte and the check field alone
    with pytest.raises(PayloadError) as e:
        hvd_gradq.Payload.from_bytes(v2)
    msg = str(e.value)
    assert msg.startswith("payload version 2: written by an older hvd_gradq, whose checksum was a weighted byte sum")
    assert "reads version 3 only" in msg and "Re-encode the tensor with this version (hvd_gradq.quantize)" in msg


@pytest.mark.parametrize("text", [
    "orq:ef=true",  # a policy: no header names one
    "orq:warmup=0",  # a default spelled out
    "orq:bucket=512,levels=5",
    "orq:levels=5,nonfinite=raise",
])
def test_a_header_naming_a_policy_or_a_default_is_refused(text):
    raw = hvd_gradq.quantize(_data((512,), np.float32), "orq").to_bytes()
    assert hvd_gradq.Payload.from_bytes(_with_spec(raw, "orq")).to_bytes() == raw  # the helper itself
    with pytest.raises(PayloadError, match="not canonical; expected 'orq'"):
        hvd_gradq.Payload.from_bytes(_with_spec(raw, text))


def _small_payloads() -> list[bytes]:
    return [
        hvd_gradq.quantize(_data((5,), np.float32), "orq:levels=3", seed=1).to_bytes(),
        hvd_gradq.quantize(_data((2, 3), np.float16), "bingrad:variant=pb").to_bytes(),
        hvd_gradq.quantize(_data((9,), np.float32), "topk:ratio=0.5").to_bytes(),
    ]


@pytest.mark.parametrize("which", range(3))
def test_every_single_bit_flip_is_refused(which):
    raw = _small_payloads()[which]
    p = hvd_gradq.Payload.from_bytes(raw)
    hlen = pl.header_size(p.scheme.spec, len(p.shape))
    assert hlen < len(raw)
    # every bit of the header, and every bit of these small bodies too
    for bit in range(len(raw) * 8):
        bad = bytearray(raw)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(PayloadError) as e:
            hvd_gradq.Payload.from_bytes(bytes(bad))
        assert str(e.value)


def test_sampled_body_bit_flips_are_refused():
    raw = hvd_gradq.quantize(_data((5000,), np.float32), "orq:levels=5", seed=3).to_bytes()
    rng = np.random.default_rng(0)
    for bit in rng.choice(len(raw) * 8, size=300, replace=False):
        bad = bytearray(raw)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(PayloadError, match=r"checksum|truncated|trailing|total|corrupt|magic|version"):
            hvd_gradq.Payload.from_bytes(bytes(bad))


def test_every_truncation_is_refused():
    for raw in _small_payloads():
        for n in range(len(raw)):
            with pytest.raises(PayloadError, match=r"truncated|checksum|short"):
                hvd_gradq.Payload.from_bytes(raw[:n])


def test_specific_corruptions_have_clear_messages():
    raw = _small_payloads()[0]

    def edit(offset: int, fmt: str, value: int, seal: bool = True) -> bytes:
        b = bytearray(raw)
        struct.pack_into(fmt, b, offset, value)
        return reseal(b) if seal else bytes(b)

    cases = [
        (b"XXXX" + raw[4:], "magic"),
        (edit(4, "<B", 4, seal=False), "version 4 is not supported"),
        (edit(4, "<B", 2), "payload version 2: written by an older hvd_gradq.*Re-encode the tensor with this version"),
        (edit(4, "<B", 1), "payload version 1: written by an older hvd_gradq.*Re-encode the tensor with this version"),
        (edit(4, "<B", 0), "version 0"),
        (edit(5, "<B", 99), "dtype code 99"),
        (edit(6, "<B", 17), "17 dimensions"),
        (edit(7, "<B", 1), "flags"),
        (edit(8, "<Q", len(raw) + 1000), f"header says {len(raw) + 1000} bytes, {len(raw)} present"),
        (edit(8, "<Q", (1 << 64) - 1), "truncated"),
        (edit(8, "<Q", 10), "shorter than its header"),
        (edit(8, "<Q", len(raw) - 1), "checksum|trailing"),  # the CRC then covers one byte less
        (edit(16, "<I", 12345, seal=False), "checksum"),
        (raw + b"\0", "1 trailing bytes"),
        (raw + raw, f"trailing bytes after a payload of {len(raw)} bytes"),
        (edit(22, "<Q", 1 << 41), "dimension of 2199023255552"),
        (edit(22, "<Q", 6), "section|sections end"),  # 6 elements no longer fit the sections
        (edit(20, "<H", 5), "invalid scheme"),  # spec text cut to "orq:l"
        (edit(20, "<H", 3), "truncated payload: section 'codes'"),  # "orq", a valid name: ORQ-5's sections
    ]
    for bad, words in cases:
        with pytest.raises(PayloadError, match=words):
            hvd_gradq.Payload.from_bytes(bad)
    # each dimension allowed, their product not
    raw2 = _small_payloads()[1]  # shape (2, 3)
    b = bytearray(raw2)
    struct.pack_into("<2Q", b, 22, 1 << 21, 1 << 20)
    with pytest.raises(PayloadError, match="2199023255552 elements"):
        hvd_gradq.Payload.from_bytes(reseal(b))


def test_invalid_spec_text_is_refused():
    raw = _small_payloads()[0]
    spec = hvd_gradq.Payload.from_bytes(raw).scheme.spec.encode()
    i = raw.index(spec)
    for replacement, words in [
        (b"\xff", "invalid scheme"),  # not UTF-8
        (b"x", "invalid scheme"),  # unknown scheme "xrq"
    ]:
        bad = bytearray(raw)
        bad[i : i + 1] = replacement
        with pytest.raises(PayloadError, match=words):
            hvd_gradq.Payload.from_bytes(reseal(bad))


def test_non_canonical_spec_is_refused():
    """The same scheme spelt another way ("ORQ", "EF=FALSE") would decode to the same payload
    yet re-encode to other bytes: the format has one spelling per payload."""
    raw = _small_payloads()[0]
    spec = hvd_gradq.Payload.from_bytes(raw).scheme.spec
    i = raw.index(spec.encode())
    for variant in ("O" + spec[1:], spec.replace("levels", "Levels"), spec.replace("levels=3", "LEVELS=3")):
        assert parse_scheme(variant) == parse_scheme(spec)  # the parser accepts it...
        bad = bytearray(raw)
        bad[i : i + len(spec)] = variant.encode()
        with pytest.raises(PayloadError, match="canonical"):  # ...the wire does not
            hvd_gradq.Payload.from_bytes(reseal(bad))


def test_huge_dimension_with_a_zero_is_refused():
    raw = hvd_gradq.quantize(np.zeros((0, 3), np.float32), "none").to_bytes()
    bad = bytearray(raw)
    struct.pack_into("<Q", bad, 30, 1 << 63)  # shape (0, 2**63): zero elements, absurd shape
    with pytest.raises(PayloadError, match="dimension"):
        hvd_gradq.Payload.from_bytes(reseal(bad))


def test_non_uint8_array_refused():
    with pytest.raises(PayloadError, match="uint8"):
        hvd_gradq.Payload.from_bytes(np.zeros(40, np.float32))


def test_split_a_concatenation():
    xs = [_data((n,), np.float32, n) for n in (0, 1, 600, 1030)]
    specs = ["orq:levels=9", "none", "bingrad", "topk:values=orq"]
    ps = [hvd_gradq.quantize(x, s, seed=i) for i, (x, s) in enumerate(zip(xs, specs))]
    blob = np.frombuffer(b"".join(p.to_bytes() for p in ps), np.uint8)
    back = split(blob)
    assert len(back) == len(ps)
    for p, q in zip(ps, back):
        assert q.to_bytes() == p.to_bytes()
        assert _same_array(hvd_gradq.dequantize(q), hvd_gradq.dequantize(p))
    assert split(np.zeros(0, np.uint8)) == []
    # a corrupt payload in the middle, or a cut at the end, is refused
    bad = blob.copy()
    bad[len(ps[0].to_bytes()) + 30] ^= 4
    with pytest.raises(PayloadError):
        split(bad)
    with pytest.raises(PayloadError, match="truncated"):
        split(blob[:-1])


# -- fuzzing ---------------------------------------------------------------------------------
_BASES = [
    hvd_gradq.quantize(_data(s, np.float32, i), spec, seed=i).to_bytes()
    for i, (s, spec) in enumerate(
        [((5,), "orq:levels=3"), ((3, 2), "bingrad"), ((9,), "topk:ratio=0.5"), ((), "none"), ((4,), "uniform:bits=4"),
         ((0,), "qsgd"), ((7,), "fp16")]
    )
]


def _check(data: bytes) -> None:
    try:
        p = hvd_gradq.Payload.from_bytes(data)
    except PayloadError as e:
        assert str(e)
        return
    assert p.to_bytes() == data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data):
    _check(data)
    _check(reseal(b"HVGQ\x01" + data))  # past magic, version and checksum


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(_BASES),
    edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.sampled_from([1, 2, 0x20, 0x80])), max_size=2),
    cut=st.integers(0, 8),
    extra=st.binary(max_size=8),
    seal=st.booleans(),
)
def test_fuzz_mutated_payloads(base, edits, flips, cut, extra, seal):
    b = bytearray(base)
    for pos, val in edits:
        b[pos % len(b)] = val
    for pos, bit in flips:  # 0x20 flips the case of a letter: a spec spelt differently
        b[pos % len(b)] ^= bit
    b = b[: len(b) - cut] + extra if cut or extra else b
    data = reseal(b) if seal else bytes(b)
    _check(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(_BASES), where=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=3),
       bit=st.sampled_from([1, 0x20]))
def test_fuzz_header_text_mutations(base, where, bit):
    """Edits aimed at the header's spec text, checksum resealed: every spelling that parses must
    be the canonical one (else the payload would not re-encode to its own bytes)."""
    speclen = struct.unpack_from("<H", base, 20)[0]
    start = 22 + 8 * base[6]  # after the fixed fields and the dims
    b = bytearray(base)
    for w in where:
        b[start + int(w * speclen)] ^= bit
    _check(reseal(b))


# -- malformed sections reach the decoders ----------------------------------------------------
def _decode_both(p: hvd_gradq.Payload) -> list[object]:
    """dequantize with the NumPy reference and with the compiled kernels: an array, or the
    PayloadError raised (any other exception propagates and fails the test)."""
    import os

    from engines import require_numba

    require_numba()  # else "1" would run the reference too: one engine compared with itself
    out: list[object] = []
    old = os.environ.get("HVD_GRADQ_KERNELS")
    try:
        for engine in ("0", "1"):
            os.environ["HVD_GRADQ_KERNELS"] = engine
            try:
                with np.errstate(all="ignore"):  # garbage metas may overflow: not an error
                    out.append(hvd_gradq.dequantize(p))
            except PayloadError as e:
                assert str(e)
                out.append(e)
    finally:
        if old is None:
            os.environ.pop("HVD_GRADQ_KERNELS", None)
        else:
            os.environ["HVD_GRADQ_KERNELS"] = old
    return out


def _body_offset(raw: bytes) -> int:
    p = hvd_gradq.Payload.from_bytes(raw)
    return pl.header_size(p.scheme.spec, len(p.shape))


def test_topk_index_out_of_range_is_a_payload_error():
    x = _data((9,), np.float32)
    raw = hvd_gradq.quantize(x, "topk:ratio=0.5").to_bytes()  # 5 indices of 4 bits (n = 9)
    b = bytearray(raw)
    b[_body_offset(raw)] = 0xFF  # the first two indices become 15 >= 9
    for got in _decode_both(hvd_gradq.Payload.from_bytes(reseal(b))):
        assert isinstance(got, PayloadError) and "out of range" in str(got)
    b = bytearray(raw)
    b[_body_offset(raw)] = 0x00  # indices 0, 0: the same element twice
    for got in _decode_both(hvd_gradq.Payload.from_bytes(reseal(b))):
        assert isinstance(got, PayloadError) and "increasing" in str(got)


@pytest.mark.parametrize("spec", ["orq:levels=129", "orq:levels=200", "orq:levels=255", "qsgd:levels=100"])
def test_code_beyond_the_alphabet_is_a_payload_error(spec):
    """129..255 symbols are sent one a byte: a byte >= symbols indexes past the table (an
    IndexError in the reference, NaN in the kernels before); both must say the payload is bad."""
    x = _data((600,), np.float32)
    raw = hvd_gradq.quantize(x, spec, seed=2).to_bytes()
    s = parse_scheme(spec).symbols
    codes_at = len(raw) - layout(s).nbytes(600)
    for pos, val in ((codes_at, 255), (len(raw) - 1, s), (codes_at + 300, min(s + 1, 255))):
        b = bytearray(raw)
        b[pos] = val
        for got in _decode_both(hvd_gradq.Payload.from_bytes(reseal(b))):
            assert isinstance(got, PayloadError) and f"alphabet of {s} symbols" in str(got), (pos, val)


_DECODE_BASES = [
    hvd_gradq.quantize(_data(s, np.float32, i), spec, seed=i).to_bytes()
    for i, (s, spec) in enumerate(
        [((40,), "topk:ratio=0.2"), ((30,), "topk:ratio=0.3,values=orq"), ((20,), "orq:levels=200"),
         ((20,), "qsgd:levels=100"), ((30,), "orq:levels=5,bucket=16"), ((25,), "uniform:bits=3,bucket=8"),
         ((20,), "qsgd:levels=2,bucket=8"), ((20,), "terngrad:bucket=8"), ((24,), "sign:bucket=8"),
         ((20,), "bingrad:variant=pb,bucket=8"), ((12,), "fp16"), ((7,), "orq:levels=3,scales=fp16,bucket=4")]
    )
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(_DECODE_BASES),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_fuzz_mutated_sections_decode_or_refuse(base, edits):
    """Edits to a payload's sections, checksum resealed so that they reach the decoders: the
    reference and the kernels either both refuse with PayloadError, or both decode the same bits
    into an array of the payload's shape and dtype. Nothing else (IndexError, a crash)."""
    start = _body_offset(base)
    b = bytearray(base)
    for where, val in edits:
        b[start + int(where * (len(base) - start))] = val
    p = hvd_gradq.Payload.from_bytes(reseal(b))  # the header is intact: it parses
    ref, fast = _decode_both(p)
    if isinstance(ref, PayloadError) or isinstance(fast, PayloadError):
        assert isinstance(ref, PayloadError) and isinstance(fast, PayloadError), (ref, fast)
        return
    assert isinstance(ref, np.ndarray) and isinstance(fast, np.ndarray)
    assert ref.shape == p.shape and ref.dtype == np.dtype(p.dtype)
    assert _same_array(ref, fast)
