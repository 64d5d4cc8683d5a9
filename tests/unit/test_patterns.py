"""The pattern and pass-through policy both frontends share (hvd_gradq.frontend.patterns.decide),
against the byte counts written out here from the payload format's sizes."""
from __future__ import annotations

import pytest

import hvd_gradq
from hvd_gradq.errors import SpecError
from hvd_gradq.frontend.patterns import EVERY, Pattern, decide, fp32_cost, parse_pattern

TF = frozenset({Pattern.GATHER, Pattern.SUMMABLE})


def test_tiny_tensors_go_fp32_only_under_auto() -> None:
    orq = hvd_gradq.parse("orq:levels=3")
    # a bias of 4 floats: an fp32 ring allreduce moves 2*(N-1)/N*16 = 16 B at N=2; a payload
    # header alone is larger than that
    assert fp32_cost(4, 2).received == 16
    assert decide(orq, 4, 1, 2, Pattern.AUTO) is Pattern.FP32
    assert decide(orq, 4, 1, 2, Pattern.GATHER) is Pattern.GATHER  # an explicit request is honoured
    assert decide(orq, 1 << 20, 2, 2, Pattern.AUTO) is Pattern.GATHER  # ~1.6 bits vs 32: compress


def test_offered_patterns_bound_the_choice() -> None:
    # QSGD-4 at 64 ranks: gather receives 63 payloads; scatter and summable stay ~2 payloads
    q = hvd_gradq.parse("qsgd:levels=4")
    n = 1 << 20
    assert decide(q, n, 1, 64, Pattern.AUTO, EVERY) in (Pattern.SCATTER, Pattern.SUMMABLE)
    assert decide(q, n, 1, 64, Pattern.AUTO, TF) is Pattern.SUMMABLE
    orq = hvd_gradq.parse("orq:levels=3")  # not summable: with scatter gone, gather is left
    assert decide(orq, n, 1, 8, Pattern.AUTO, EVERY) is Pattern.SCATTER
    assert decide(orq, n, 1, 8, Pattern.AUTO, TF) is Pattern.GATHER  # 7 x 1.6 bits < 2 x 7/8 x 32
    # at 64 ranks gather would receive 63 x 1.6 bits an element, more than fp32's 2 x 63/64 x 32
    assert decide(orq, n, 1, 64, Pattern.AUTO, TF) is Pattern.FP32


def test_skip_never_sums_and_summable_needs_even_levels() -> None:
    skip = hvd_gradq.parse("qsgd:levels=4,nonfinite=skip")
    assert decide(skip, 1 << 20, 1, 4, Pattern.SUMMABLE) is Pattern.GATHER
    with pytest.raises(SpecError, match="summable"):
        decide(hvd_gradq.parse("orq:levels=3"), 1 << 20, 1, 4, Pattern.SUMMABLE)


def test_fp32_is_a_decision_not_a_request() -> None:
    with pytest.raises(SpecError, match="valid: auto, gather, summable, scatter"):
        parse_pattern("fp32")
    assert parse_pattern("Gather") is Pattern.GATHER
