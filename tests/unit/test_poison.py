"""hvd_gradq/reduce/stop.py: how a rank that cannot encode a gradient tells the others why
(the poison payload, the hierarchical flag, the summable statistic), and the errors they raise."""
from __future__ import annotations

import numpy as np
import pytest

import hvd_gradq
from hvd_gradq import GradqError, NonFiniteError, RangeError, RankMismatchError
from hvd_gradq.api import split
from hvd_gradq.reduce import codec, stop
from hvd_gradq.schemes.level import EvenLevelScheme
from hvd_gradq.schemes.summable import local_stats
from hvd_gradq.wire import poison, read_header
from hvd_gradq.wire import poison as wire_poison
from hvd_gradq.xp import NUMPY

ORQ = hvd_gradq.parse("orq:levels=5")


def _payload(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return codec.encode(ORQ, x, seed, "t")[0]


def test_the_errors_of_encoding_say_why() -> None:
    nan = np.ones(600, np.float32)
    nan[3] = np.nan
    big = np.ones(600, np.float32)
    big[3] = 2e38  # finite, beyond 2**127
    with pytest.raises(NonFiniteError) as e1:
        codec.encode(hvd_gradq.parse("orq:levels=5,nonfinite=raise"), nan, 0, "t")
    with pytest.raises(RangeError, match="magnitude 2e\\+38") as e2:
        codec.encode(ORQ, big, 0, "t")
    with pytest.raises(RangeError, match="exceeds fp16's range") as e3:
        codec.encode(hvd_gradq.parse("fp16:overflow=raise"), np.full(8, 1e6, np.float32), 0, "t")
    assert stop.stop_of(e1.value) is poison.Stop.NONFINITE
    assert stop.stop_of(e2.value) is poison.Stop.RANGE and stop.stop_of(e3.value) is poison.Stop.RANGE
    assert stop.stop_of(GradqError("other")) is poison.Stop.ERROR
    assert issubclass(RangeError, GradqError) and issubclass(RangeError, ValueError)


@pytest.mark.parametrize("why", list(poison.Stop))
def test_a_poison_says_why_and_names_the_rank(why: poison.Stop) -> None:
    head = read_header(poison.poison(why))
    assert head.spec.startswith("!") and poison.stop_in(head) == (why, None)
    buf = np.concatenate([_payload(700, 0), poison.poison(why), _payload(700, 2)])
    cls = {poison.Stop.NONFINITE: NonFiniteError, poison.Stop.RANGE: RangeError}.get(why, GradqError)
    with pytest.raises(cls, match=r"^w: rank\(s\) \[1\] ") as info:
        codec.split_checked(buf, "w")
    assert stop.stops_of(info.value) == {1: why}
    with pytest.raises(cls, match=r"^w: rank\(s\) \[6\] "):  # payload i is rank ranks[i]
        codec.decode_sum(buf, 0, None, "w", ranks=[2, 6, 10])
    # a rank that passes on another's stop names that one (the hierarchical pattern's relays)
    relay = np.concatenate([_payload(700, 0), poison.poison(why, origin=5)])
    assert poison.stop_in(read_header(poison.poison(why, origin=5))) == (why, 5)
    with pytest.raises(cls, match=r"^w: rank\(s\) \[5\] "):
        codec.split_checked(relay, "w", ranks=[0, 2])


def test_empty_payloads_are_not_poisons() -> None:
    """A tensor's chunk may be empty (scatter, a tensor smaller than a bucket a rank): such a
    payload is flat, the poison is two-dimensional, so neither is taken for the other, even
    when every rank sent a poison (all of one size)."""
    empty = codec.encode(ORQ, np.zeros(0, np.float32), 0, "t")[0]
    assert poison.stop_in(read_header(empty)) is None and split(empty)[0].n == 0
    total, count = codec.decode_sum(np.concatenate([empty, empty]), 0, None, "w")
    assert count == 2 and total.shape == (0,)
    with pytest.raises(NonFiniteError, match=r"rank\(s\) \[0, 1\]"):
        codec.split_checked(np.concatenate([poison.poison(), poison.poison()]), "w")
    with pytest.raises(RankMismatchError):  # sizes that differ without a poison: another model
        codec.split_checked(np.concatenate([_payload(700), _payload(300)]), "w")


@pytest.mark.parametrize("why", list(poison.Stop))
def test_a_padded_poison_fills_a_fixed_width_row(why: poison.Stop) -> None:
    """TensorFlow's rows have a traced width: the poison, zero-padded to it, reads the same; it
    fits the smallest payload a frontend sends (one fp16 element of a scalar)."""
    row = poison.poison(why, width=300)
    assert row.shape == (300,) and not row[wire_poison.SIZE :].any()
    assert poison.stop_in(read_header(row)) == (why, None)
    smallest = hvd_gradq.quantize(np.ones((), np.float32), "fp16").to_array()
    assert wire_poison.SIZE <= smallest.size
    assert poison.poison(why, width=smallest.size).shape == smallest.shape
    with pytest.raises(hvd_gradq.PayloadError, match="cannot hold it"):
        poison.poison(why, width=wire_poison.SIZE - 1)
    rows = np.stack([_payload(700, 0), poison.poison(why, width=_payload(700, 0).size)])
    assert stop.stops_in(rows, ranks=[4, 7]) == {7: why}


def test_mixed_reasons_name_each_group() -> None:
    stops = {0: poison.Stop.RANGE, 2: poison.Stop.NONFINITE, 3: poison.Stop.RANGE}
    e = stop.stopped("w (step 4)", stops)
    assert isinstance(e, NonFiniteError)  # NaN/Inf somewhere: the non-finite error users catch
    text = str(e)
    assert text.startswith("w (step 4): rank(s) [2] had non-finite values")
    assert "rank(s) [0, 3] had a finite value in this gradient that the scheme cannot quantize" in text
    assert stop.stops_of(e) == stops and stop.stops_of(ValueError("x")) == {}


def test_the_hierarchical_flag_round_trips_in_float32() -> None:
    assert stop.flag_stop(0.0) is None
    for why in poison.Stop:
        for rank in (0, 1, 7, 1000, (1 << 21) - 1):
            flag = float(np.float32(stop.stop_flag(why, rank)))
            assert stop.flag_stop(flag) == (why, rank)


@pytest.mark.parametrize("spec", ["uniform:bits=4", "uniform:bits=8,clip=2.5", "qsgd:levels=4", "qsgd:levels=2,norm=l2",
                                  "terngrad", "terngrad:clip=0"])
def test_the_summable_range_statistic_is_no_buckets(spec: str) -> None:
    """Every statistic of values inside the scheme's limit stays below 2**127, where the
    statistics that name a rank (stop.range_stat) begin; the Max of several names the lowest."""
    scheme = hvd_gradq.parse(spec).scheme
    assert isinstance(scheme, EvenLevelScheme)
    below = np.float32(np.nextafter(np.float32(scheme.limit), np.float32(0)))
    x = np.concatenate([np.full(512, below), np.full(512, -below), np.linspace(-below, below, 512, dtype=np.float32)])
    stats = np.asarray(local_stats(scheme, NUMPY, x.astype(np.float32)))
    finite = stats[np.isfinite(stats)]
    assert finite.size and float(finite.max()) < 2.0**127
    assert stop.range_rank(float(finite.max())) is None
    for rank in (0, 1, 3, 4095):
        assert float(np.float32(stop.range_stat(rank))) == stop.range_stat(rank)  # exact in float32
        assert stop.range_rank(stop.range_stat(rank)) == rank
    assert max(stop.range_stat(3), stop.range_stat(1)) == stop.range_stat(1)
    assert stop.range_rank(float("inf")) is None and stop.range_rank(float("nan")) is None
