"""The fp16 fallback of ``pattern=auto`` (plan/decide.decide) and the CPU figures it reads
(plan/cpu_cost.Figures, measured and agreed by frontend/probe): fp16 exactly where the model
says the scheme is slower, never with ``fallback=False`` or an explicit pattern, and one decision
for every rank whatever each measured. Horovod's fp16 time is written out here from its ring
(2(N-1)/N x 2 bytes an element) and the cast figures given."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from hvd_gradq import log
from hvd_gradq.errors import GradqError, RankMismatchError
from hvd_gradq.frontend import probe
from hvd_gradq.plan.cpu_cost import ADD_NS, CAST, CAST_NS, Figures, ns_per_element
from hvd_gradq.plan.decide import choose, cpu_seconds, decide, seconds
from hvd_gradq.plan.pattern import EVERY, Pattern, duration
from hvd_gradq.plan.second_phase import reduced_scheme
from hvd_gradq.reduce.stats import Stats
from hvd_gradq.spec import parse, parse_scheme

SPECS = ["orq:levels=3", "orq:levels=5", "orq:levels=9", "qsgd:levels=4", "bingrad", "sign", "uniform:bits=4"]


def fp16_seconds(n: int, nranks: int, gbps: float, cast: tuple[float, float]) -> float:
    """Horovod's Compression.fp16 by the model's rules: its ring's bytes on the wire, the cast there and back."""
    ring = round(2 * (nranks - 1) / nranks * 2 * n)
    return ring * 8 / (gbps * 1e9) + (cast[0] + cast[1]) * n * 1e-9


def figures(spec: str, enc: float, dec: float, cast: tuple[float, float] = (0.5, 0.5)) -> Figures:
    scheme = parse_scheme(spec)
    rows = [(s.spec, enc, dec) for s in probe.schemes_for(scheme, 64, 8)]
    return Figures((*rows, (CAST, *cast)))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("nranks,local", [(2, 1), (8, 1), (8, 2)])
@pytest.mark.parametrize("gbps", [0.1, 1.0, 10.0, 100.0])
@pytest.mark.parametrize("enc,dec", [(0.2, 0.1), (20.0, 1.0), (200.0, 5.0)])
def test_fp16_exactly_where_the_model_says_the_scheme_is_slower(spec: str, nranks: int, local: int, gbps: float,
                                                                 enc: float, dec: float) -> None:
    scheme = parse_scheme(spec)
    fig = figures(spec, enc, dec)
    n = 1 << 20
    kept = decide(scheme, n, 2, nranks, Pattern.AUTO, EVERY, local, gbps, False, fig).pattern
    choice = decide(scheme, n, 2, nranks, Pattern.AUTO, EVERY, local, gbps, True, fig)
    got, why = choice.pattern, choice.why
    assert kept is not Pattern.FP16  # fallback=False: never
    if kept is Pattern.FP32:  # no saving in bytes: Horovod's fp32, before any question of time
        assert got is Pattern.FP32
        return
    mine = seconds(scheme, n, 2, nranks, kept, local, gbps, fig)
    theirs = fp16_seconds(n, nranks, gbps, (0.5, 0.5))
    assert seconds(scheme, n, 2, nranks, Pattern.FP16, local, gbps, fig) == pytest.approx(theirs, rel=1e-12)
    if mine > theirs:
        assert got is Pattern.FP16, why
        assert why == (f"fallback: modelled {kept.value} {duration(mine)} vs fp16 {duration(theirs)} "
                       f"at {gbps:g} Gbit/s")
    else:
        assert got is kept, why


def test_the_figures_decide_both_ways() -> None:
    """One tensor, one link: a slow codec goes fp16, a fast one keeps its scheme; and at a slow
    link bytes win whatever the codec costs."""
    orq = parse_scheme("orq:levels=5")
    n = 1 << 22
    slow, fast = figures(orq.spec, 300.0, 10.0), figures(orq.spec, 0.1, 0.05)
    assert decide(orq, n, 2, 8, Pattern.AUTO, fallback=True, link_gbps=10.0, figures=slow).pattern is Pattern.FP16
    assert decide(orq, n, 2, 8, Pattern.AUTO, fallback=True, link_gbps=10.0, figures=fast).pattern in (Pattern.GATHER, Pattern.SCATTER)
    assert decide(orq, n, 2, 8, Pattern.AUTO, fallback=True, link_gbps=0.01, figures=slow).pattern in (Pattern.GATHER, Pattern.SCATTER)


@pytest.mark.filterwarnings("ignore:pattern=hierarchical needs")
@pytest.mark.parametrize("requested", [Pattern.GATHER, Pattern.SCATTER, Pattern.HIERARCHICAL, Pattern.SUMMABLE])
def test_an_explicit_pattern_never_falls_back(requested: Pattern) -> None:
    q = parse_scheme("qsgd:levels=4")
    slow = figures(q.spec, 1000.0, 100.0)
    for nranks, local, gbps in ((8, 1, 1000.0), (8, 2, 1000.0), (2, 1, 100.0)):
        p = decide(q, 1 << 20, 2, nranks, requested, EVERY, local, gbps, True, slow).pattern
        assert p is not Pattern.FP16 and p is choose(q, 1 << 20, 2, nranks, requested, EVERY, local, gbps, slow)


def test_only_propagate_falls_back_and_one_rank_never() -> None:
    """fp16 carries NaN/Inf as Horovod does: a scheme that raises or skips on them keeps its scheme."""
    slow = (1000.0, 100.0)
    for spec, want in (("orq:levels=5", True), ("orq:levels=5,nonfinite=raise", False),
                       ("orq:levels=5,nonfinite=skip", False)):
        s = parse(spec)  # the scheme and its nonfinite policy
        fig = Figures(((s.scheme.spec, *slow), (CAST, 0.5, 0.5)))
        assert (decide(s, 1 << 20, 2, 8, Pattern.AUTO, fallback=True, link_gbps=100.0, figures=fig).pattern is Pattern.FP16) is want, spec
    s = parse_scheme("orq:levels=5")
    assert decide(s, 1 << 20, 2, 1, Pattern.AUTO, fallback=True, figures=Figures(((s.spec, *slow),))).pattern is not Pattern.FP16


def test_measured_figures_replace_the_table_and_the_rest_stays() -> None:
    orq = parse_scheme("orq:levels=3")
    n, nranks = 1 << 16, 4
    fig = Figures(((orq.spec, 10.0, 1.0),))
    assert cpu_seconds(orq, n, nranks, Pattern.GATHER, figures=fig) == pytest.approx(
        (10.0 * n + (1.0 + ADD_NS) * (nranks - 1) * n) * 1e-9)
    enc, dec = ns_per_element(orq)  # no figures: the table
    assert cpu_seconds(orq, n, nranks, Pattern.GATHER) == pytest.approx((enc * n + (dec + ADD_NS) * (nranks - 1) * n)
                                                                         * 1e-9)
    # the cast: measured where given, else the table's constant
    assert cpu_seconds(orq, n, nranks, Pattern.FP16, figures=Figures(((CAST, 0.25, 0.5),))) == pytest.approx(
        0.75 * n * 1e-9)
    assert cpu_seconds(orq, n, nranks, Pattern.FP16) == pytest.approx(sum(CAST_NS) * n * 1e-9)


def test_schemes_for_lists_what_the_model_prices_once_each() -> None:
    orq = parse_scheme("orq:levels=3")
    assert [s.spec for s in probe.schemes_for(orq, 4)] == [orq.spec, reduced_scheme(orq, 4).spec]
    got = [s.spec for s in probe.schemes_for(orq, 8, 2)]  # the reduced chunk over 8 ranks and over 4 hosts
    assert got == list(dict.fromkeys([orq.spec, reduced_scheme(orq, 8).spec, reduced_scheme(orq, 4).spec]))
    sign = parse_scheme("sign")  # no finer form: one entry
    assert [s.spec for s in probe.schemes_for(sign, 16, 4)] == [sign.spec]
    assert [s.spec for s in probe.schemes_for(orq, 1)] == [orq.spec]


def test_agree_takes_the_elementwise_maximum_whatever_the_order() -> None:
    keys = ("a", "b", CAST)
    rows = np.array([[1.0, 9.0, 3.0, 0.5, 0.2, 0.1],
                     [2.0, 1.0, 3.5, 0.4, 0.3, 0.1],
                     [0.5, 2.0, 1.0, 0.6, 0.1, 0.7]])
    want = {"a": (2.0, 9.0), "b": (3.5, 0.6), CAST: (0.3, 0.7)}
    for rank, order in enumerate(itertools.permutations(range(3))):  # any rank's own row, any gather order
        mine = Figures(tuple((k, *rows[rank % 3, 2 * i: 2 * i + 2]) for i, k in enumerate(keys)))
        assert np.array_equal(probe.to_row(mine), rows[rank % 3])
        got = probe.agree(mine, rows[list(order)].reshape(-1))
        assert {k: (e, d) for k, e, d in got.ns} == want
        assert [k for k, _, _ in got.ns] == list(keys)


def test_ranks_with_different_figures_decide_alike_once_agreed() -> None:
    """Three ranks measured ORQ-5 at different speeds; decided on their own figures they would
    split (one fp16, one compressed); on the agreed maximum every rank takes the same pattern."""
    orq = parse_scheme("orq:levels=5")
    n, nranks, gbps = 1 << 22, 3, 10.0
    own = [figures(orq.spec, e, d) for e, d in ((0.5, 0.1), (40.0, 2.0), (5.0, 0.5))]
    alone = {decide(orq, n, 2, nranks, Pattern.AUTO, fallback=True, link_gbps=gbps, figures=f).pattern for f in own}
    assert len(alone) > 1, alone  # the test needs ranks that would disagree
    gathered = np.concatenate([probe.to_row(f) for f in own])
    agreed = [probe.agree(f, gathered) for f in own]
    assert len(set(agreed)) == 1
    assert {decide(orq, n, 2, nranks, Pattern.AUTO, fallback=True, link_gbps=gbps, figures=f).pattern for f in agreed} == {Pattern.FP16}


def test_agree_refuses_rows_of_another_width() -> None:
    mine = Figures((("a", 1.0, 2.0),))
    with pytest.raises(RankMismatchError, match="different sets of schemes"):
        probe.agree(mine, np.ones(5))


def test_measure_times_each_scheme_and_the_cast() -> None:
    schemes = probe.schemes_for(parse_scheme("orq:levels=3"), 4)
    calls = []

    def cast(x: np.ndarray) -> np.ndarray:
        calls.append(x.size)
        return x.astype(np.float16).astype(np.float32)

    got = probe.measure(schemes, cast, elements=4096, reps=2)
    assert [k for k, _, _ in got.ns] == [s.spec for s in schemes] + [CAST]
    assert all(np.isfinite(e) and np.isfinite(d) and e > 0 and d > 0 for _, e, d in got.ns)
    assert calls == [4096] * 3  # a warm-up and the timed runs
    assert got.get(CAST) is not None and got.get("nothing") is None


def test_the_fallback_reason_parses() -> None:
    orq = parse_scheme("orq:levels=9")
    choice = decide(orq, 1 << 20, 2, 8, Pattern.AUTO, fallback=True, link_gbps=100.0)
    p, why = choice.pattern, choice.why
    assert p is Pattern.FP16
    m = re.fullmatch(r"fallback: modelled (\w+) (.+) vs fp16 (.+) at 100 Gbit/s", why)
    assert m is not None, why
    assert m.group(3) == duration(seconds(orq, 1 << 20, 2, 8, Pattern.FP16, 1, 100.0))


def test_stats_and_the_first_step_line_name_the_fallback() -> None:
    """A tensor sent as fp16 counts Horovod's fp16 ring (x1.00 against fp16) under pattern fp16,
    with its reason; the log line groups it as ``fp16 1 (fallback)``."""
    orq, n, nranks = parse_scheme("orq:levels=9"), 1 << 20, 8
    choice = decide(orq, n, 2, nranks, Pattern.AUTO, fallback=True, link_gbps=100.0)
    p, why = choice.pattern, choice.why
    ring16 = round(2 * (nranks - 1) / nranks * 2 * n)
    st = Stats()
    st.begin_step()
    st.decide("w", p.value, why, n, nranks)
    st.record("w", ring16, ring16)
    out = st.summary({"scheme": orq.spec, "pattern": "auto", "ranks": nranks, "ranks_a_host": 1, "link_gbps": 100.0})
    assert out["tensors"]["w"]["pattern"] == "fp16" and out["tensors"]["w"]["why"] == why
    assert out["last_step"]["fp16"]["vs_fp16_allreduce"] == 1.0
    assert "fp16 1 (fallback)" in log.describe(out, "first step")


def test_fallback_argument_then_environment_then_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(probe.FALLBACK_ENV, raising=False)
    assert probe.resolve_fallback() is False and probe.resolve_fallback(True) is True
    for raw, want in (("0", False), ("off", False), ("No", False), ("1", True), (" true ", True), ("on", True)):
        monkeypatch.setenv(probe.FALLBACK_ENV, raw)
        assert probe.resolve_fallback() is want, raw
        assert probe.resolve_fallback(not want) is (not want)  # the argument wins
    monkeypatch.setenv(probe.FALLBACK_ENV, "maybe")
    with pytest.raises(GradqError, match="HVD_GRADQ_FALLBACK='maybe' is not valid"):
        probe.resolve_fallback()
    with pytest.raises(GradqError, match="fallback must be True or False"):
        probe.resolve_fallback(1)  # type: ignore[arg-type]


def test_figures_table_mode_skips_timing_and_gives_the_shipped_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """HVD_GRADQ_FIGURES=table: no timing at all (measure would raise), the table's figures for
    each scheme the model prices and the default cast, agreed as usual; a bad value is refused."""
    scheme = parse_scheme("orq:levels=5")

    def no_timing(*_a: object, **_k: object) -> Figures:
        raise AssertionError("measured although HVD_GRADQ_FIGURES=table")

    monkeypatch.setattr(probe, "measure", no_timing)
    monkeypatch.setenv(probe.FIGURES_ENV, "table")
    got = probe.agreed(scheme, 4, 1, lambda x: x, lambda row: np.stack([row, row]))
    want = {s.spec: ns_per_element(s) for s in probe.schemes_for(scheme, 4, 1)}
    assert {k: (e, d) for k, e, d in got.ns if k != CAST} == want
    assert got.get(CAST) == CAST_NS
    monkeypatch.setenv(probe.FIGURES_ENV, "measure")
    with pytest.raises(AssertionError, match="measured although"):
        probe.agreed(scheme, 4, 1, lambda x: x, lambda row: np.stack([row, row]))
    monkeypatch.setenv(probe.FIGURES_ENV, "fast")
    with pytest.raises(GradqError, match="HVD_GRADQ_FIGURES='fast' is not valid"):
        probe.agreed(scheme, 4, 1, lambda x: x, lambda row: np.stack([row, row]))
