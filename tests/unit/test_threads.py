"""One tensor's encode and decode over several threads (hvd_gradq/kernels/parallel.py): the same
payload bytes and decoded floats as one thread's, bit for bit, for every level scheme; the split
plan's ranges cover the buckets, in order, on packing-unit boundaries; ``threads=`` resolves
argument > compressor > ``HVD_GRADQ_THREADS`` > this rank's cores.

The ranges only split from 2 x 64K elements; most tests lower that minimum to 1 element, so that
short inputs (with tails, odd buckets, lone tail buckets) run as 2, 3 and 4 ranges, and assert
that they did split. The one-thread result is itself checked against the NumPy reference
(``scheme.encode(NUMPY, ...)``, which shares no code with the kernels) for one input a scheme.
"""
from __future__ import annotations

import itertools
import math
import os
import select
import threading
import warnings

import numpy as np
import pytest
from engines import require_numba
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_gradq import GradqError, dequantize, kernels, quantize
from hvd_gradq.frontend import workers
from hvd_gradq.kernels import parallel
from hvd_gradq.spec import parse_scheme
from hvd_gradq.wire.packing import layout
from hvd_gradq.xp import NUMPY

SCHEMES = [
    "uniform:bits=2", "uniform:bits=4", "uniform:bits=8", "uniform:bits=5,rounding=stochastic", "qsgd:levels=4", "qsgd:levels=2,norm=l2", "terngrad",
    "terngrad:clip=0", "sign", "bingrad", "bingrad:variant=pb", "orq:levels=3", "orq:levels=5", "orq:levels=9",
]
OPTIONS = ["", "clip=1.5", "scales=fp16", "bucket=37", "bucket=100,clip=2,scales=fp16", "bucket=5"]
THREADS = (2, 3, 4)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    require_numba()
    monkeypatch.setenv("HVD_GRADQ_KERNELS", "1")
    monkeypatch.delenv(parallel.ENV, raising=False)
    monkeypatch.setattr(parallel, "_configured", None)  # a compressor built by another test set it


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_RANGE_ELEMS", 1)


def _with(spec: str, opt: str) -> str:
    if not opt:
        return spec
    if "clip=" in spec:
        opt = ",".join(o for o in opt.split(",") if not o.startswith("clip="))
    return spec + ("," if ":" in spec else ":") + opt if opt else spec


def _step(spec: str) -> tuple[int, int]:
    """(bucket, elements an aligned step of buckets holds), from the wire layout."""
    scheme = parse_scheme(spec)
    lay = layout(scheme.symbols)
    unit = lay.group * 8 if lay.bits < 8 else lay.group  # symbols that fill whole bytes
    d = scheme.bucket
    return d, d * unit // math.gcd(d, unit)


def _sizes(spec: str) -> list[int]:
    d, step = _step(spec)
    # tiny, a bucket's neighbours, one step, tails after 2-4 steps, a tail bucket alone in a range
    return sorted({1, 7, d - 1 if d > 1 else 1, d + 1, step, step + 1, 2 * step + 3, 3 * step + d // 2 + 1,
                   4 * step + 1})


def _input(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if n > 300:
        x[100:160] = 0.0  # zeros, a constant run, an outlier, tiny values
        x[200:260] = -1.25
        x[n // 2] = 4e3
        x[n - 20 : n - 10] = 1e-30
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.ascontiguousarray(a, np.float32).view(np.uint32) if a.dtype.kind == "f" else a.astype(np.int64)


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = _bits(a), _bits(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} != {b.shape}"
    bad = np.nonzero(a != b)[0]
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}"


@pytest.mark.parametrize("base", SCHEMES)
def test_every_thread_count_gives_one_threads_bytes_and_floats(base: str, small_ranges: None) -> None:
    for opt in OPTIONS:
        spec = _with(base, opt)
        scheme = parse_scheme(spec)
        k = kernels.kernel(scheme)
        assert k is not None, spec
        split_seen = 0
        for n in _sizes(spec):
            x = _input(n, n)
            one = kernels.encode(scheme, x, 99, threads=1)
            assert one is not None
            dec1 = kernels.decode(scheme, one, n, threads=1)
            assert dec1 is not None
            for t in THREADS:
                ranges = parallel.split(n, k.d, k.unit, t, 1)
                split_seen = max(split_seen, len(ranges))
                what = f"{spec} n={n} threads={t} ranges={ranges}"
                got = kernels.encode(scheme, x, 99, threads=t)
                assert got is not None
                _same(one["meta"], got["meta"], what + " meta")
                _same(one["codes"], got["codes"], what + " codes")
                # decode in ranges, of the one-thread payload
                _same(dec1, kernels.decode(scheme, one, n, threads=t), what + " decoded")
        assert split_seen == max(THREADS), f"{spec}: the inputs never split into {max(THREADS)} ranges"


@pytest.mark.parametrize("base", SCHEMES)
def test_split_encode_matches_the_numpy_reference(base: str, small_ranges: None) -> None:
    for opt in ("", "bucket=37,clip=1.5,scales=fp16"):
        spec = _with(base, opt)
        scheme = parse_scheme(spec)
        _, step = _step(spec)
        n = 3 * step + 11
        x = _input(n, 5)
        ref = scheme.encode(NUMPY, x, 7)
        dref = scheme.decode(NUMPY, {key: np.asarray(v) for key, v in ref.items()}, n)
        got = kernels.encode(scheme, x, 7, threads=3)
        assert got is not None
        _same(ref["meta"], got["meta"], spec + " meta")
        _same(ref["codes"], got["codes"], spec + " codes")
        _same(dref, kernels.decode(scheme, got, n, threads=3), spec + " decoded")


@pytest.mark.parametrize("spec", ["uniform:bits=4", "orq:levels=5", "bingrad", "sign,bucket=100"])
def test_public_api_payloads_are_the_same_bytes_at_the_real_threshold(spec: str) -> None:
    spec = spec.replace(",bucket", ":bucket")
    n = 3 * parallel.MIN_RANGE_ELEMS + 777
    scheme = parse_scheme(spec)
    k = kernels.kernel(scheme)
    assert k is not None and len(parallel.split(n, k.d, k.unit, 4)) == 3  # n // MIN_RANGE_ELEMS caps it
    x = _input(n, 3).reshape(5, -1)  # n = 5 * 39477: a 2-D gradient
    one = quantize(x, spec, seed=5, threads=1)
    back = dequantize(one, threads=1)
    assert back.shape == x.shape
    for t in (0, 2, 3, 4, None):
        p = quantize(x, spec, seed=5, threads=t)
        assert p.to_bytes() == one.to_bytes(), f"{spec} threads={t}"
        _same(back.reshape(-1), dequantize(p, threads=t).reshape(-1), f"{spec} threads={t} decoded")


def test_small_tensors_stay_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = parallel.run

    def spy(job, ranges):  # type: ignore[no-untyped-def]
        seen.append(len(ranges))
        return real(job, ranges)

    monkeypatch.setattr(parallel, "run", spy)
    x = _input(2 * parallel.MIN_RANGE_ELEMS - 1, 1)
    scheme = parse_scheme("uniform:bits=8")
    p = kernels.encode(scheme, x, 1, threads=4)
    assert p is not None
    kernels.decode(scheme, p, x.size, threads=4)
    kernels.encode(scheme, np.concatenate([x, x[:1]]), 1, threads=4)
    assert seen == [1, 1, 2]
    # the encoders that sort and search split from 1/8 of that; their decoders (a table look-up) do not
    least = parallel.MIN_RANGE_ELEMS // parallel.SEARCH_DIVISOR
    for spec in ("bingrad", "orq:levels=5"):
        seen.clear()
        short = parse_scheme(spec)
        p = kernels.encode(short, x[: 2 * least - 1], 1, threads=4)
        assert p is not None
        q = kernels.encode(short, x[: 2 * least], 1, threads=4)
        assert q is not None
        kernels.decode(short, q, 2 * least, threads=4)
        assert seen == [1, 2, 1], spec


def test_the_input_scan_over_ranges_finds_what_numpy_finds(small_ranges: None) -> None:
    """quantize's input check (kernels.scan), split over ranges of elements: NaN, inf or a value
    beyond the limit in any one range, against NumPy's own answer."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 5, 1000, 4099):
        for bad, at in [(None, 0), (np.nan, 0), (np.inf, -1), (-np.inf, n // 2), (3e38, n // 3), (-2e30, n - 1),
                        (np.nan, n // 2)]:
            x = rng.standard_normal(n).astype(np.float32)
            if bad is not None:
                x[at] = bad
            if n > 3:
                x[1] = np.inf if bad is np.nan else x[1]  # NaN and inf in different ranges
            want = (bool(np.isfinite(x).all()), bool(np.isfinite(x).all() and np.abs(x).max() < 1e30))
            for t in (1, 2, 3, 4):
                assert kernels.scan(x, 1e30, t) == want, (n, bad, at, t)


# -- the split plan -------------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 200_000), d=st.integers(1, 700), unit=st.sampled_from([1, 5, 8, 16, 24, 40, 64]),
       threads=st.integers(1, 9), min_elems=st.sampled_from([1, 100, 4096, 1 << 16]))
def test_split_ranges_are_aligned_covering_disjoint_and_balanced(n: int, d: int, unit: int, threads: int,
                                                                 min_elems: int) -> None:
    ranges = parallel.split(n, d, unit, threads, min_elems)
    nb = -(-n // d)
    assert ranges[0][0] == 0 and ranges[-1][1] == nb  # covering, in order
    for (_, a1), (b0, _) in itertools.pairwise(ranges):
        assert a1 == b0  # contiguous, so disjoint
    assert all(b0 < b1 for b0, b1 in ranges)  # none empty
    assert all((b0 * d) % unit == 0 for b0, _ in ranges)  # each starts on a packing unit
    assert 1 <= len(ranges) <= max(1, min(threads, n // min_elems))
    sizes = [b1 - b0 for b0, b1 in ranges]
    q = unit // math.gcd(d, unit)
    assert max(sizes[:-1] or [0]) - min(sizes) <= q + (q - 1)  # even to an aligned step (the last: the rest)
    if len(ranges) < threads and n >= min_elems * threads:
        # fewer ranges than asked only where aligned steps run out
        assert len(ranges) == -(-nb // q)


def test_split_of_a_large_tensor_is_even() -> None:
    # ORQ-5's 24-symbol units over buckets of 512: boundaries every 3 buckets, so 16383, not 16384
    ranges = parallel.split(16 << 20, 512, 24, 2)
    assert ranges == [(0, 16383), (16383, 32768)] and 16383 * 512 % 24 == 0
    assert parallel.split(100, 512, 8, 4) == [(0, 1)]


@pytest.mark.parametrize("s", [2, 3, 4, 5, 9, 16, 17, 33, 256])
def test_range_starts_are_the_wire_layouts_byte_offsets(s: int) -> None:
    spec = "uniform:bits=8" if s == 256 else (f"orq:levels={s}" if s > 2 else "sign")
    if s in (4, 16):
        spec = f"uniform:bits={int(math.log2(s))}"
    k = kernels.kernel(parse_scheme(spec))
    assert k is not None and k.s == s
    lay = layout(s)
    for m in range(0, 50):
        e = m * k.unit
        assert k.byte_at(e) == lay.nbytes(e)  # the wire's bytes for e symbols: whole words, no padding


# -- how many threads ------------------------------------------------------------------------------------
def test_argument_beats_compressor_beats_environment_beats_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "cores", lambda: 16)
    for var in parallel.LOCAL_SIZE_ENVS:
        monkeypatch.delenv(var, raising=False)
    assert parallel.resolve() == 16
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert parallel.resolve() == 4  # 16 cores, 4 ranks on the host
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "32")
    assert parallel.resolve() == 1  # at least one
    monkeypatch.setenv(parallel.ENV, "3")
    assert parallel.resolve() == 3
    parallel.configure(5)
    assert parallel.resolve() == 5 and parallel.resolve(2) == 2 and parallel.resolve(0) == 1
    parallel.configure(None)
    monkeypatch.setenv(parallel.ENV, "many")
    with pytest.raises(GradqError, match=r"HVD_GRADQ_THREADS: 'many' is not a number of threads"):
        parallel.resolve()
    with pytest.raises(GradqError, match=r"threads=: 99 is not a number of threads; use 0 \(inline\) \.\. 64"):
        kernels.encode(parse_scheme("qsgd"), np.ones(10, np.float32), 0, threads=99)


@pytest.mark.parametrize("threads,local,codec,pipeline", [
    (None, 2, 4, 1),  # 8 cores, 2 ranks a host: 4 codec threads, one pipelining worker
    (None, 8, 1, 0),  # one core a rank: inline, one thread
    (0, 1, 1, 0), (1, 8, 1, 1), (6, 8, 6, 1),
])
def test_a_compressors_threads_set_the_codec_and_the_pipelining_pool(
        monkeypatch: pytest.MonkeyPatch, threads: int | None, local: int, codec: int, pipeline: int) -> None:
    monkeypatch.setattr(workers, "cores", lambda: 8)
    w = workers.start(threads, local)
    assert parallel.resolve() == codec and w.threads == pipeline


# -- the pool ------------------------------------------------------------------------------------------------
def test_run_uses_the_caller_for_the_first_range_and_waits_for_every_range() -> None:
    me = threading.get_ident()
    where: dict[int, int] = {}
    gate = threading.Event()

    def job(b0: int, b1: int) -> None:
        if b0:
            gate.wait(5)  # the caller finishes first, then must still wait for these
        where[b0] = threading.get_ident()

    def first(b0: int, b1: int) -> None:
        job(b0, b1)
        gate.set()

    parallel.run(lambda b0, b1: (first if b0 == 0 else job)(b0, b1), [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert sorted(where) == [0, 1, 2, 3] and where[0] == me
    assert all(where[b] != me for b in (1, 2, 3))
    assert parallel.pool(1) is parallel.pool(3)  # large enough: kept
    assert parallel._pool_size >= 3
    bigger = parallel.pool(parallel._pool_size + 2)
    assert parallel.pool(1) is bigger


def test_run_raises_a_ranges_error_after_every_range_ended() -> None:
    done: list[int] = []

    def job(b0: int, b1: int) -> None:
        if b0 == 2:
            raise ValueError("range 2 failed")
        done.append(b0)

    with pytest.raises(ValueError, match="range 2 failed"):
        parallel.run(job, [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert sorted(done) == [0, 1, 3]


def test_concurrent_callers_share_a_growing_pool(small_ranges: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers on several threads (a frontend's worker, TensorFlow's inter-op threads) asking for
    more and more threads: the pool is replaced while others submit to it, and every call still
    gets one thread's bytes."""
    monkeypatch.setattr(parallel, "_pool", None)
    monkeypatch.setattr(parallel, "_pool_size", 0)
    scheme = parse_scheme("orq:levels=5,bucket=64")
    x = _input(64 * 24 * 9 + 5, 8)
    want = kernels.encode(scheme, x, 1, threads=1)
    assert want is not None
    bad: list[str] = []

    def caller(i: int) -> None:
        for rep in range(12):
            t = 1 + (i + rep) % 9  # up to 9 ranges: the pool grows to 8 threads on the way
            got = kernels.encode(scheme, x, 1, threads=t)
            if got is None or bytes(got["codes"]) != bytes(want["codes"]) or bytes(got["meta"]) != bytes(want["meta"]):
                bad.append(f"caller {i} threads {t}")

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(120)
    assert not any(c.is_alive() for c in callers) and bad == [] and parallel._pool_size == 8


def test_a_forked_child_encodes_on_threads_of_its_own() -> None:
    """The parent's pool threads do not survive fork(): the child makes its own pool (else its
    ranges would wait forever in the copied pool's queue)."""
    x = _input(4 * parallel.MIN_RANGE_ELEMS, 2)
    scheme = parse_scheme("uniform:bits=4")
    want = kernels.encode(scheme, x, 3, threads=4)  # the parent's pool exists now
    assert want is not None and parallel._pool is not None
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: encode on 4 threads, send the codes, exit without pytest's cleanup
        try:
            got = kernels.encode(scheme, x, 3, threads=4)
            os.write(w, b"ok" if got is not None and bytes(got["codes"]) == bytes(want["codes"]) else b"no")
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 60)
        answer = os.read(r, 2) if ready else b"timeout"
    finally:
        os.close(r)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert answer == b"ok", answer
