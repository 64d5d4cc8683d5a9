"""The compressor core both frontends subclass (hvd_gradq/frontend/compressor.py), without a
framework: its argument checks, the configuration ranks compare, the handshake over a fake
allgather, the decision and warm-up, Horovod's final scaling, the process set and the world
``stats()`` reports. The frontends' own tests (tests/parallel) run the same code through Horovod."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hvd_gradq
from hvd_gradq.errors import GradqError, RankMismatchError, SpecError
from hvd_gradq.frontend import figure_cache, link, probe
from hvd_gradq.frontend.compressor import CompressorCore, final_scale, ranks_on_host
from hvd_gradq.kernels import parallel
from hvd_gradq.plan import hosts
from hvd_gradq.plan.cpu_cost import Figures
from hvd_gradq.plan.decide import DEFAULT_LINK_GBPS, Choice, decide
from hvd_gradq.plan.pattern import EVERY, ONE_RANK_WHY, Pattern, compresses, why_tag
from hvd_gradq.reduce import handshake
from hvd_gradq.reduce.names import Kind


class Core(CompressorCore):
    """A frontend of nothing: the hooks answer fixed values."""

    FRONTEND, WORLD_NAME, CONFIG_TAG = "hvd_gradq.fake", "fake", "fake"

    def _ranks(self) -> int | None:
        return 4

    def _ranks_a_host(self) -> int:
        return 2

    def _hosts(self) -> int | None:
        return 2


class OneRankCore(Core):
    PASSES_ONE_RANK = True


class GraphCore(Core):
    """A frontend whose later phases cannot be poisoned (as TensorFlow's)."""

    UNPOISONABLE = frozenset({Pattern.SCATTER, Pattern.HIERARCHICAL})
    UNPOISONABLE_WHY = "its later phases start too late"

    def _scope(self) -> str:
        return "c7"


@dataclass(frozen=True)
class FakeSet:
    process_set_id: int


@pytest.fixture(autouse=True)
def _codec_threads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A core sets the process's codec threads (as a compressor does): back to the default after.
    The CPU figures it times are kept in this test's own file, not beside the machine's kernels."""
    for var in ("HVD_GRADQ_LINK_GBPS", "HVD_GRADQ_FALLBACK", "HVD_GRADQ_LOG", "HVD_GRADQ_FIGURES",
                "HVD_GRADQ_HANDSHAKE_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(figure_cache, "path", lambda: tmp_path / figure_cache.FILE)
    yield
    parallel.configure(None)


ORQ = hvd_gradq.parse("orq:levels=5")


# -- the arguments --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,cls,words", [
    ({"seed": "1"}, GradqError, ["seed must be an integer", "str"]),
    ({"seed": True}, GradqError, ["seed must be an integer", "bool"]),
    ({"pattern": "ring"}, SpecError, ["pattern='ring' is not valid", "valid: auto, gather, summable"]),
    ({"link_gbps": -1.0}, GradqError, ["link_gbps=-1.0 is not a link rate", "positive number"]),
    ({"link_gbps": float("nan")}, GradqError, ["is not a link rate"]),
    ({"fallback": "yes"}, GradqError, ["fallback must be True or False"]),
    ({"process_set": 3}, GradqError, ["process_set must be a horovod ProcessSet", "int"]),
    ({"threads": -2}, GradqError, ["threads=: -2 is not a number of threads", "use 0 (inline)"]),
    ({"pattern": "summable"}, SpecError, ["pattern=summable needs evenly spaced levels", "Valid here: auto"]),
])
def test_bad_arguments_raise_what_to_write(kwargs: dict[str, Any], cls: type, words: list[str]) -> None:
    with pytest.raises(cls) as e:
        Core(ORQ, **kwargs)
    assert isinstance(e.value, GradqError) and isinstance(e.value, ValueError)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_environment_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_LOG", "loud")
    with pytest.raises(GradqError, match="HVD_GRADQ_LOG='loud' is not a log level"):
        Core(ORQ)
    monkeypatch.delenv("HVD_GRADQ_LOG")
    monkeypatch.setenv("HVD_GRADQ_LINK_GBPS", "fast")
    with pytest.raises(GradqError, match="HVD_GRADQ_LINK_GBPS='fast' is not a link rate"):
        Core(ORQ)
    monkeypatch.delenv("HVD_GRADQ_LINK_GBPS")
    monkeypatch.setenv("HVD_GRADQ_HANDSHAKE_TIMEOUT", "never")
    with pytest.raises(GradqError, match="HVD_GRADQ_HANDSHAKE_TIMEOUT='never' is not valid"):
        Core(ORQ)


def test_options_are_normalised() -> None:
    c = Core("qsgd:levels=4,ef=true", seed=3, pattern="SCATTER", link_gbps=25, threads=0, fallback=True,
             check_ranks=0)  # type: ignore[arg-type]
    assert c.scheme.spec == hvd_gradq.parse("qsgd:levels=4").scheme.spec and c.policy.ef
    assert (c.seed, c.pattern, c.link_gbps, c.fallback, c.threads, c.check_ranks) == (
        3, Pattern.SCATTER, 25.0, True, 0, False)
    assert isinstance(c.link_gbps, float) and c.process_set is None
    assert Core(ORQ).link_gbps == DEFAULT_LINK_GBPS and Core(ORQ).fallback is False


def test_a_pattern_the_frontend_cannot_poison_is_refused_with_the_ones_it_can() -> None:
    raising = hvd_gradq.parse("orq:levels=5,nonfinite=raise")
    with pytest.raises(GradqError) as e:
        GraphCore(raising, pattern="scatter")
    text = str(e.value)
    assert "nonfinite=raise with pattern=scatter is not supported by hvd_gradq.fake" in text
    assert "its later phases start too late" in text and "pattern=gather / summable / auto" in text
    GraphCore(raising, pattern="gather")  # a pattern it can poison
    Core(raising, pattern="scatter")  # a frontend that can poison every pattern
    GraphCore(ORQ, pattern="scatter")  # nothing stops on values


# -- the configuration ------------------------------------------------------------------------------------
def test_config_is_equal_for_equal_settings_and_differs_in_every_agreed_field() -> None:
    base = Core("orq:levels=5,ef=true", seed=1, pattern="gather")
    same = Core(hvd_gradq.parse("orq:levels=5,ef=true"), seed=1, pattern="gather", link_gbps=1.0, threads=0)
    assert base.config() == same.config() and base.digest() == same.digest()
    assert base.digest() == hashlib.sha256(base.config().encode()).hexdigest()[:16]
    others = [
        Core("orq:levels=3,ef=true", seed=1, pattern="gather"),  # the scheme
        Core("orq:levels=5", seed=1, pattern="gather"),  # the policy
        Core("orq:levels=5,ef=true,warmup=2", seed=1, pattern="gather"),
        Core("orq:levels=5,ef=true", seed=2, pattern="gather"),  # the seed
        Core("orq:levels=5,ef=true", seed=1, pattern="auto"),  # the pattern
        OneRankCore("orq:levels=5,ef=true", seed=1, pattern="gather"),  # another class, the same tag: equal
        GraphCore("orq:levels=5,ef=true", seed=1, pattern="gather"),  # a compressor's name
    ]
    digests = [c.digest() for c in others]
    assert digests[5] == base.digest()
    del digests[5]
    assert base.digest() not in digests and len(set(digests)) == len(digests)
    assert "seed=1" in base.config() and "pattern=gather" in base.config() and "fake" in base.config()
    assert "name=c7" in others[-1].config()


# -- the handshake ------------------------------------------------------------------------------------------
class Ranks:
    """A fake allgather: this rank's row, then each other rank's: ``others[kind]`` if given, else
    the rows ``peers`` (their configuration texts and ``check_ranks``) send, else this rank's row
    (``copies`` times: ranks that agree)."""

    def __init__(self, others: dict[Kind, list[np.ndarray[Any, Any]]] | None = None,
                 peers: list[tuple[str, bool]] | None = None, copies: int = 1) -> None:
        self.calls: list[tuple[Kind, np.ndarray[Any, Any], float]] = []
        self.others = others or {}
        self.peers = peers
        self.copies = copies

    def __call__(self, row: np.ndarray[Any, Any], kind: Kind, seconds: float) -> np.ndarray[Any, Any]:
        self.calls.append((kind, row.copy(), seconds))
        theirs = self.others.get(kind)
        if theirs is None and self.peers is not None and kind is Kind.CONFIG:
            theirs = [handshake.config_block(t, c) for t, c in self.peers]
        elif theirs is None and self.peers is not None and kind is Kind.CONFIG_TEXT:
            theirs = [handshake.text_block(t) for t, _ in self.peers]
        return np.concatenate([row] + [r.astype(row.dtype) for r in (theirs if theirs is not None
                                                                      else [row] * self.copies)])

    @property
    def kinds(self) -> list[Kind]:
        return [k for k, _, _ in self.calls]


def _sent(block: np.ndarray[Any, Any]) -> handshake.Row:
    """What this rank's block says."""
    return handshake.read_blocks(block, 1)[0]


def _compared(c: CompressorCore, size: int = 2, local: int = 1) -> str:
    """The whole text a compressor's ranks compare (its configuration and the cluster layout)."""
    return c.config() + hosts.layout(size, local, c.link_gbps, c.fallback, c.pattern)


def test_handshake_compares_the_configuration_and_layout_once_a_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_HANDSHAKE_TIMEOUT", "7")
    c = Core(ORQ, seed=5, pattern="gather", link_gbps=2.5)
    ranks = Ranks(copies=3)
    c.handshake("", 4, 2, ranks, lambda x: x)
    assert ranks.kinds == [Kind.CONFIG]  # an explicit pattern: no CPU figures to agree
    assert ranks.calls[0][2] == 7.0  # each collective waits the bound the environment sets
    sent = _sent(ranks.calls[0][1])
    assert sent.shown == f"handshake v1: {c.config()}|hosts=2x2" and sent.check  # gather reads no link rate
    assert sent.digest == hashlib.sha256(_compared(c, 4, 2).encode()).digest()
    c.handshake("", 4, 2, ranks, lambda x: x)
    assert len(ranks.calls) == 1 and "" in c._checked  # once a process set
    c.handshake(7, 4, 1, ranks, lambda x: x)
    assert len(ranks.calls) == 2 and _sent(ranks.calls[1][1]).shown.endswith("|hosts=4x1")
    c.forget_handshakes()  # a new world: again
    c.handshake("", 4, 2, ranks, lambda x: x)
    assert len(ranks.calls) == 3


def test_handshake_stops_on_a_rank_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_FIGURES", "table")
    other = Core(ORQ, seed=6, pattern="gather")
    mine = Core(ORQ, seed=5, pattern="gather")
    ranks = Ranks(peers=[(_compared(other), True)])
    with pytest.raises(RankMismatchError,
                       match=r"ranks disagree on the hvd_gradq configuration: ranks \[0\]: seed=5; ranks \[1\]: seed=6 "):
        mine.handshake("", 2, 1, ranks, lambda x: x)
    assert ranks.kinds == [Kind.CONFIG, Kind.CONFIG_TEXT]  # the digests differ: the whole texts, then the error
    # the same configuration but another link rate, under auto: the layout is compared too
    auto = Core(ORQ, seed=5, pattern="auto")
    theirs = _compared(Core(ORQ, seed=5, pattern="auto", link_gbps=25.0))
    with pytest.raises(RankMismatchError, match=r"ranks \[0\]: link=10\.0; ranks \[1\]: link=25\.0 \(in full: .*seed=5"):
        auto.handshake("", 2, 1, Ranks(peers=[(theirs, True)]), lambda x: x)


def test_handshake_ignores_a_link_rate_no_decision_reads() -> None:
    """Issue 35, item 13: a fixed gather, summable or scatter takes no decision by the link
    rate, so ranks with other rates run; under auto and hierarchical they are refused."""
    for spec, pattern in ((ORQ, "gather"), (ORQ, "scatter"), (hvd_gradq.parse("qsgd:levels=4"), "summable")):
        theirs = _compared(Core(spec, pattern=pattern, link_gbps=25.0, fallback=True))
        ranks = Ranks(peers=[(theirs, True)])
        Core(spec, pattern=pattern, link_gbps=1.0).handshake("", 2, 1, ranks, lambda x: x)
        assert ranks.kinds == [Kind.CONFIG], pattern  # the same digest: nothing more to gather
    for pattern in ("auto", "hierarchical"):
        theirs = _compared(Core(ORQ, pattern=pattern, link_gbps=25.0))
        with pytest.raises(RankMismatchError, match=r"ranks \[0\]: link=1\.0; ranks \[1\]: link=25\.0"):
            Core(ORQ, pattern=pattern, link_gbps=1.0).handshake("", 2, 1, Ranks(peers=[(theirs, True)]), lambda x: x)


def test_handshake_compares_fields_past_the_old_blocks_end() -> None:
    """Issue 35, item 9: with a 301-digit seed the old block cut off fallback and the version, so
    ranks that differed only in fallback passed, and Horovod later failed on float16 vs float32."""
    mine = Core(ORQ, seed=10**300, pattern="auto", fallback=False)
    theirs = _compared(Core(ORQ, seed=10**300, pattern="auto", fallback=True))
    assert len(theirs.encode()) > 254 and theirs.encode()[:254] == _compared(mine).encode()[:254]
    with pytest.raises(RankMismatchError, match=r"ranks \[0\]: fallback=off; ranks \[1\]: fallback=on "):
        mine.handshake("", 2, 1, Ranks(peers=[(theirs, True)]), lambda x: x)


def test_check_ranks_differs_but_every_rank_takes_the_same_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, item 8: a rank with check_ranks=False once skipped the configuration allgather
    and left the others waiting in it. Now every rank sends its block; the check stops the job
    if any rank asked for it, so all ranks do the same; with check_ranks=False everywhere a
    difference is a warning."""
    monkeypatch.setenv("HVD_GRADQ_FIGURES", "table")
    c = Core(ORQ, pattern="gather", check_ranks=False)
    same = Ranks(peers=[(_compared(c), True)])
    c.handshake("", 2, 1, same, lambda x: x)  # only check_ranks differs: both run
    assert same.kinds == [Kind.CONFIG] and not _sent(same.calls[0][1]).check
    other = _compared(Core(ORQ, seed=9, pattern="gather"))
    with pytest.raises(RankMismatchError, match=r"ranks \[0\]: seed=0; ranks \[1\]: seed=9"):
        Core(ORQ, pattern="gather", check_ranks=False).handshake("", 2, 1, Ranks(peers=[(other, True)]), lambda x: x)
    with pytest.raises(RankMismatchError, match=r"ranks \[0\]: seed=9; ranks \[1\]: seed=0"):
        Core(ORQ, seed=9, pattern="gather").handshake("", 2, 1, Ranks(peers=[(_compared(c), False)]), lambda x: x)
    quiet = Ranks(peers=[(_compared(Core(ORQ, seed=9, pattern="auto", check_ranks=False)), False)])
    unchecked = Core(ORQ, pattern="auto", check_ranks=False)
    with pytest.warns(UserWarning, match=r"ranks \[0\]: seed=0; ranks \[1\]: seed=9 .*check_ranks=False on every rank"):
        unchecked.handshake("", 2, 1, quiet, lambda x: x)
    assert quiet.kinds == [Kind.CONFIG, Kind.CONFIG_TEXT, Kind.CPU] and unchecked.agreed("") is not None


def test_handshake_names_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_HANDSHAKE_TIMEOUT", "0.5")
    c = Core(ORQ, pattern="gather")

    def never(row: np.ndarray[Any, Any], kind: Kind, seconds: float) -> np.ndarray[Any, Any]:
        raise handshake.Stalled(f"hvd_gradq.{kind.value}", seconds)

    with pytest.raises(GradqError) as e:
        c.handshake("", 2, 1, never, lambda x: x)
    msg = str(e.value)
    assert msg.startswith("hvd_gradq.fake: no handshake from the other ranks within 0.5 s. This rank waits in "
                          "collective hvd_gradq.config (the first-step check of its compressor "
                          f"'{_compared(c)}' over 2 ranks)"), msg
    assert "HVD_GRADQ_HANDSHAKE_TIMEOUT" in msg and not isinstance(e.value, RankMismatchError)


def test_handshake_names_a_rank_of_another_version() -> None:
    c = Core(ORQ, pattern="gather")
    old = np.zeros(256, np.uint8)
    text = (c.config() + "|hosts=2x1|link=10.0").encode()
    old[1], old[2:2 + len(text)] = len(text), np.array(list(text), np.uint8)  # the unversioned block
    with pytest.raises(RankMismatchError, match=r"ranks \[1\]: handshake v0 \(hvd_gradq up to configuration version 5"):
        c.handshake("", 2, 1, Ranks({Kind.CONFIG: [old]}), lambda x: x)


def test_handshake_agrees_on_the_slowest_ranks_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVD_GRADQ_FIGURES", "table")  # this rank's figures: the shipped table
    c = Core(ORQ, pattern="auto", check_ranks=False)
    ranks = Ranks()
    c.handshake("", 2, 1, ranks, lambda x: x)
    assert ranks.kinds == [Kind.CONFIG, Kind.CPU]  # the configuration, whatever check_ranks, then the figures
    row = ranks.calls[1][1]
    slower = Ranks({Kind.CPU: [row * 3.0]})
    c2 = Core(ORQ, pattern="auto", check_ranks=False)
    c2.handshake("", 2, 1, slower, lambda x: x)
    mine, agreed = c.agreed(""), c2.agreed("")
    assert mine is not None and agreed is not None
    assert [e * 3.0 for _, e, _ in mine.ns] == [e for _, e, _ in agreed.ns]  # the maximum over ranks
    assert c2.agreed("other set") is None


def test_handshake_measures_the_link_where_nobody_gave_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: the link rate is measured, not a default. The rate the ranks agree on prices
    every decision (and the report); a given rate, or the table's figures, are not measured."""
    monkeypatch.setattr(probe, "measure", lambda schemes, cast=None, **_: Figures(tuple((s.spec, 5.0, 1.0)
                                                                                     for s in schemes)))
    monkeypatch.setenv("HVD_GRADQ_FIGURES", "measure")
    c = Core(ORQ, pattern="auto", check_ranks=False)
    assert c.world()["link"] == "default" and c.world()["link_gbps"] == DEFAULT_LINK_GBPS
    # a peer whose calls take 5 ms more, its 1 MiB payloads at 0.2 Gbit/s: slower than this one's
    slow = np.array([0.005, 0.005 + link.LARGE * 8 / 0.2e9])
    ranks = Ranks({Kind.LINK: [slow]})
    c.handshake("", 2, 1, ranks, lambda x: x)
    assert ranks.kinds[:2] == [Kind.CONFIG, Kind.CPU] and set(ranks.kinds[2:]) == {Kind.LINK}
    figures = c.agreed("")
    assert figures is not None and figures.link_gbps is not None
    assert figures.link_gbps == pytest.approx(0.2 * (link.LARGE - link.SMALL) / link.LARGE, rel=1e-9)  # the peer's
    assert link.rate_of(figures, c.link_gbps) == figures.link_gbps == c.world()["link_gbps"]
    assert c.world()["link"].startswith("measured: ")
    n = 1 << 16
    assert c.decide(n, 1, 2, 1, figures) == decide(ORQ, n, 1, 2, Pattern.AUTO, local=1, link_gbps=figures.link_gbps,
                                                     figures=figures)
    for given, env in (({"link_gbps": 1.0}, {}), ({}, {"HVD_GRADQ_LINK_GBPS": "3"}), ({}, {"HVD_GRADQ_FIGURES": "table"})):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        other = Ranks()
        Core(ORQ, pattern="auto", check_ranks=False, **given).handshake("", 2, 1, other, lambda x: x)
        assert Kind.LINK not in other.kinds, (given, env)
        monkeypatch.delenv("HVD_GRADQ_LINK_GBPS", raising=False)
        monkeypatch.setenv("HVD_GRADQ_FIGURES", "measure")


def test_handshake_without_a_collective_or_peers_does_nothing() -> None:
    c = Core(ORQ, pattern="auto")
    c.handshake("", 4, 1, None, lambda x: x)  # no collective can run now (a TF1-style graph)
    ranks = Ranks()
    c.handshake("", 4, 1, ranks, lambda x: x)  # checked already
    c.handshake("alone", 1, 1, ranks, lambda x: x)  # one rank: nobody to compare with
    assert ranks.calls == [] and c.agreed("") is None and c._checked == {"", "alone"}


# -- the decision and the warm-up ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,size,local,pattern", [
    (10, 4, 1, "auto"), (1 << 20, 4, 1, "auto"), (1 << 20, 8, 2, "auto"), (5000, 2, 1, "scatter"),
    (1 << 16, 4, 2, "hierarchical"),
])
def test_decide_is_the_cost_models_decision(n: int, size: int, local: int, pattern: str) -> None:
    c = Core(ORQ, pattern=pattern, link_gbps=1.0, fallback=True)
    want = decide(ORQ, n, 1, size, Pattern(pattern), EVERY, local, 1.0, True, None)
    assert c.decide(n, 1, size, local, None) == want


def test_decide_leaves_out_what_the_frontend_cannot_poison() -> None:
    raising = hvd_gradq.parse("orq:levels=5,nonfinite=raise")
    g = GraphCore(raising, link_gbps=0.01)
    assert g.offered() == frozenset({Pattern.GATHER, Pattern.SUMMABLE})
    n = 1 << 22  # large over many ranks on a slow link: the model would take scatter if it could
    assert decide(raising, n, 1, 16, Pattern.AUTO, link_gbps=0.01).pattern is Pattern.SCATTER
    assert g.decide(n, 1, 16, 1, None).pattern is Pattern.GATHER
    assert Core(raising, link_gbps=0.01).decide(n, 1, 16, 1, None).pattern is Pattern.SCATTER
    assert GraphCore(ORQ).offered() == EVERY


def test_one_rank_passes_through_where_the_frontend_says_so() -> None:
    assert OneRankCore(ORQ, pattern="gather").decide(1000, 1, 1, 1, None) == Choice(Pattern.FP32, ONE_RANK_WHY)
    assert Core(ORQ, pattern="gather").decide(1000, 1, 1, 1, None).pattern is Pattern.GATHER


def test_warm_up_sends_the_first_steps_exact() -> None:
    c = Core("orq:levels=5,warmup=2", pattern="gather")
    for step in (0, 1):
        got = c.warm(Choice(Pattern.GATHER, "requested"), step)
        assert got.pattern is Pattern.FP32 and why_tag(got.why) == "warm-up", got.why
        assert f"step {step + 1} of 2, then gather" in got.why
    assert c.warm(Choice(Pattern.GATHER, "requested"), 2) == Choice(Pattern.GATHER, "requested")
    for p in (Pattern.FP32, Pattern.FP16):  # Horovod's own reductions have no warm-up
        assert c.warm(Choice(p, "no saving"), 0) == Choice(p, "no saving")
    assert Core(ORQ).warm(Choice(Pattern.GATHER, "x"), 0) == Choice(Pattern.GATHER, "x")
    assert c.warm_note(Choice(Pattern.SCATTER, "auto")) == "auto; the first 2 steps fp32 (warm-up)"
    assert c.warm_note(Choice(Pattern.FP32, "no saving")) == "no saving"
    assert c.warm_note(Choice(Pattern.FP16, "f")) == "f"
    assert Core("orq:levels=5,warmup=1").warm_note(Choice(Pattern.GATHER, "r")) == "r; the first 1 step fp32 (warm-up)"
    assert [compresses(p) for p in (None, Pattern.FP32, Pattern.FP16, Pattern.GATHER)] == [False, False, False, True]


# -- Horovod's final scaling --------------------------------------------------------------------------------
@pytest.mark.parametrize("v", [1.0, 3.0, 0.5, 6.0, float("nan")])
def test_final_scale_is_stock_horovods_result_with_the_plain_cases_exact(v: float) -> None:
    total = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    size = 3
    want = total / np.float32(3.0) if v == 1.0 else total if v == 3.0 else total * np.float32(v / 3.0)
    eager = final_scale(total, v, size)
    assert eager.dtype == np.float32 and eager.tobytes() == want.tobytes()
    # in place (PyTorch's decompress, on its own sum): the same bits in the same array, NumPy and torch
    import torch

    for buf in (total.copy(), torch.from_numpy(total.copy())):
        got = final_scale(buf, v, size, in_place=True)
        assert got is buf and np.asarray(got).tobytes() == want.tobytes(), type(buf)
    traced = np.asarray(final_scale(total, np.float32(v), size, np.where, np.equal), np.float32)  # as a graph
    if v in (1.0, 3.0):
        assert traced.tobytes() == want.tobytes()
    else:
        assert np.allclose(traced, want, rtol=1e-6, equal_nan=True)


# -- the process set and the world --------------------------------------------------------------------------
def test_the_reduction_set_is_horovods_the_constructors_or_the_global_one() -> None:
    g, a, b = FakeSet(0), FakeSet(1), FakeSet(2)
    assert Core(ORQ).reduction_set(None, g) is g
    assert Core(ORQ).reduction_set(a, g) is a
    assert Core(ORQ, process_set=a).reduction_set(None, g) is a
    assert Core(ORQ, process_set=a).reduction_set(FakeSet(1), g) == a
    for called in (b, g):  # another set, the global one included, is refused
        with pytest.raises(GradqError) as e:
            Core(ORQ, process_set=a).reduction_set(called, g)
        assert "process_set=1" in str(e.value) and "pass the same process set to both" in str(e.value)


def test_world_and_stats_report_the_run() -> None:
    c = Core("qsgd:levels=4", pattern="gather", link_gbps=5.0)
    assert c.world() == {"frontend": "fake", "scheme": hvd_gradq.parse("qsgd:levels=4").spec, "pattern": "gather",
                         "ranks": 4, "hosts": 2, "ranks_a_host": 2, "link_gbps": 5.0, "link": "given",
                         "intra_op_threads": None, "rank_cores": parallel.rank_cores()}

    class Telemetry:
        def summary(self) -> dict[str, Any]:
            return c._stats.summary(c.world())

    c._telemetry = Telemetry()
    c._stats.begin_step()
    c._stats.decide("w", "gather", "requested", 1000, 4)
    c._stats.record("w", 300, 900)
    out = c.stats()
    assert out["world"]["frontend"] == "fake" and out["tensors"]["w"]["pattern"] == "gather"
    assert c.metrics()["hvd_gradq/bytes_sent"] == 300
    assert c.summary().startswith("hvd_gradq: qsgd (pattern=gather), 4 ranks on 2 hosts of 2; cost model: "
                                  "5 Gbit/s, 2 ranks a host; 1 step\n")


def test_ranks_on_host_asks_horovod_and_says_none_before_init() -> None:
    class Up:
        def local_size(self) -> int:
            return 3

    class Down:
        def local_size(self) -> int:
            raise ValueError("Horovod has not been initialized; use hvd.init().")

    assert ranks_on_host(Up()) == 3 and ranks_on_host(Down()) is None
