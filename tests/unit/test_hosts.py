"""hvd_gradq/plan/hosts.py: the cluster facts the ranks compare are the ones ``decide`` reads."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hvd_gradq import RankMismatchError
from hvd_gradq.plan import hosts
from hvd_gradq.plan.decide import decide, reads_fallback, reads_link
from hvd_gradq.plan.pattern import EVERY, REQUESTABLE, Pattern
from hvd_gradq.reduce import handshake
from hvd_gradq.spec import parse_scheme


def _crossover() -> tuple[float, float]:
    """Two adjacent float link rates between which ``decide`` changes its pattern (ORQ-9, 4M
    elements, 8 ranks: scatter on slow links, gather on fast ones), found by bisection."""
    orq = parse_scheme("orq:levels=9")

    def pick(gbps: float) -> Pattern:
        return decide(orq, 1 << 22, 2, 8, Pattern.AUTO, link_gbps=gbps).pattern

    lo, hi = 0.1, 1000.0
    assert pick(lo) is not pick(hi)
    while math.nextafter(lo, hi) < hi:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if pick(mid) is pick(lo) else (lo, mid)
    assert pick(lo) is not pick(hi)
    return lo, hi


def _compare(*texts: str) -> None:
    """The handshake's comparison of these ranks' texts (:mod:`hvd_gradq.reduce.handshake`)."""
    rows = handshake.read_blocks(np.concatenate([handshake.config_block(t, True) for t in texts]), len(texts))
    if handshake.differ(rows):
        handshake.settle(rows, list(texts))


def test_rates_that_decide_differently_do_not_pass_the_rank_check() -> None:
    lo, hi = _crossover()
    assert f"{lo:g}" == f"{hi:g}"  # what the check compared before: the same text
    a, b = hosts.layout(8, 1, lo), hosts.layout(8, 1, hi)
    assert a != b
    with pytest.raises(RankMismatchError, match=r"ranks \[1\]"):
        _compare("orq|" + a, "orq|" + b)


def test_layout_is_exact_and_stable() -> None:
    for gbps in (10.0, 1.0000001, 1.0000002, 0.1 + 0.2, 25.0, 1e-3):
        text = hosts.layout(16, 4, gbps)
        assert text.startswith("|hosts=4x4|link=") and text.endswith("|fallback=off")
        assert float(text.split("link=")[1].split("|")[0]) == gbps  # round-trips: the exact value decide uses
    assert hosts.layout(16, 4, 1.0000001) != hosts.layout(16, 4, 1.0000002)
    assert hosts.layout(8, 2, hosts.link_gbps(3.0)) == hosts.layout(8, 2, 3.0)
    _compare(*["x" + hosts.layout(8, 2, 0.3)] * 2)  # equal rates pass


@pytest.mark.parametrize("requested", list(REQUESTABLE))
def test_layout_holds_the_link_rate_and_fallback_where_a_decision_reads_them(requested: Pattern) -> None:
    """Issue 35, item 13: ranks compare the link rate and ``fallback`` only where ``decide`` can
    choose otherwise by them (auto; hierarchical's cross-host part reads the rate); for the
    patterns asked for by name, every rate and fallback decide alike, which this checks."""
    text = hosts.layout(8, 2, 2.5, True, requested)
    assert ("|link=2.5" in text) is (requested in (Pattern.AUTO, Pattern.HIERARCHICAL))
    assert ("|fallback=on" in text) is (requested is Pattern.AUTO)
    assert hosts.layout(8, 2, 2.5, False, requested) == text.replace("fallback=on", "fallback=off")
    if reads_link(requested) or reads_fallback(requested):
        return
    spec = parse_scheme("qsgd:levels=4") if requested is Pattern.SUMMABLE else parse_scheme("orq:levels=9")
    for n, size, local in ((1 << 22, 8, 1), (1 << 16, 8, 2), (300, 2, 1)):
        choices = {decide(spec, n, 2, size, requested, EVERY, local, gbps, fallback).pattern
                   for gbps in (0.001, 0.1, 1.0, 10.0, 1e4) for fallback in (False, True)}
        assert choices == {requested}, (n, size, local, choices)
