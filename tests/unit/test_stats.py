"""Telemetry: why each tensor takes its pattern (plan/decide.decide), the byte and time
accounting (reduce/stats.py) against the ring-allreduce model written out here, the flat
metrics, and the log (hvd_gradq/log.py): one line, on rank 0 only unless asked."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import hvd_gradq
from hvd_gradq import log
from hvd_gradq.plan.decide import Choice, decide, seconds
from hvd_gradq.plan.pattern import CROSS, EVERY, ONE_RANK_WHY, Pattern, duration, warmup_why, why_tag
from hvd_gradq.reduce.report import crowding, placement
from hvd_gradq.reduce.stats import KINDS, Clock, Reports, Stats, flat_metrics, ratio, tally
from hvd_gradq.spec import parse_scheme
from hvd_gradq.wire.payload import header_size

TAGS = {"requested", "auto", "no saving", "fallback", "nonfinite=skip", "one rank a host", "warm-up", "one rank"}


def ring(n: int, nranks: int, itemsize: int) -> int:
    """Bytes a rank sends in a ring allreduce of n elements: 2(N-1)/N x itemsize x n, rounded."""
    return round(2 * (nranks - 1) * itemsize * n / nranks)


# -- why ------------------------------------------------------------------------------------------
GRID = [(spec, n, nranks, local, gbps)
        for spec in ("orq:levels=3", "orq:levels=5", "qsgd:levels=4", "bingrad", "sign", "none")
        for n in (4, 300, 1 << 14, 1 << 20)
        for nranks, local in ((2, 1), (8, 1), (64, 1), (8, 2))
        for gbps in (0.1, 1.0, 100.0)]


@pytest.mark.filterwarnings("ignore:pattern=hierarchical needs")
@pytest.mark.parametrize("requested", [Pattern.AUTO, Pattern.GATHER, Pattern.HIERARCHICAL])
def test_the_reason_goes_with_the_pattern_decide_picks(requested: Pattern) -> None:
    for spec, n, nranks, local, gbps in GRID:
        scheme = parse_scheme(spec)
        choice = decide(scheme, n, 2, nranks, requested, EVERY, local, gbps)
        why = choice.why
        assert why_tag(why) in TAGS, why
        if requested is not Pattern.AUTO:
            assert why_tag(why) in ("requested", "one rank a host"), why


def test_auto_reasons_state_the_model_times_at_the_link_rate() -> None:
    """Parse every ``auto`` reason: the chosen pattern comes first; the times are the model's
    (``seconds``) at the stated rate, ascending, unless gather was kept because the fastest was
    not 10% faster; the patterns that move no less than fp32 are named."""
    kept = 0
    for spec, n, nranks, local, gbps in GRID:
        scheme = parse_scheme(spec)
        choice = decide(scheme, n, 2, nranks, Pattern.AUTO, EVERY, local, gbps)
        p, why = choice.pattern, choice.why
        if why_tag(why) != "auto":
            continue
        assert f" at {gbps:g} Gbit/s" in why, why
        listed = re.findall(r"(gather|scatter|summable|hierarchical) ([0-9.e+]+ (?:us|ms|s))\b", why.split(";")[0])
        assert listed[0][0] == p.value, why
        for name, text in listed:  # each time is the model's, as duration() prints it
            assert text == duration(seconds(scheme, n, 2, nranks, Pattern(name), local, gbps)), (why, name)
        t = {Pattern(name): seconds(scheme, n, 2, nranks, Pattern(name), local, gbps) for name, _ in listed}
        if "is not 10% faster" in why:
            kept += 1
            (faster, _), = [x for x in listed if x[0] != "gather"]
            assert p is Pattern.GATHER and 0.9 * t[p] <= t[Pattern(faster)] < t[p], why
        else:
            assert [name for name, _ in listed] == [q.value for q in sorted(t, key=t.get)], why
        if "no less than fp32" in why:
            for name in why.split("; ")[1].split(" would")[0].split(", "):
                assert name not in {q.value for q in t}, why
    assert kept, "no case in the grid where gather was kept: the 10% rule went untested"


@pytest.mark.filterwarnings("ignore:pattern=hierarchical needs")
def test_the_other_reasons_say_what_happened() -> None:
    orq = parse_scheme("orq:levels=3")
    payload = header_size(orq.spec, 1) + orq.nbytes(4)
    assert decide(orq, 4, 1, 2, Pattern.AUTO) == Choice(
        Pattern.FP32, f"no saving: gather would move {payload} B a rank, fp32 allreduce {ring(4, 2, 4)} B (4 elements)")
    assert decide(orq, 1 << 20, 2, 8, Pattern.SCATTER) == Choice(Pattern.SCATTER, "requested")
    choice = decide(orq, 1 << 20, 2, 8, Pattern.HIERARCHICAL, EVERY, 1, 1.0)
    p, why = choice.pattern, choice.why
    assert why.startswith("one rank a host: hierarchical is its cross-host part; auto: ") and p in CROSS
    skip = hvd_gradq.parse("orq:levels=3,nonfinite=skip")
    choice = decide(skip, 1 << 20, 2, 8, Pattern.HIERARCHICAL, EVERY, 2, 1.0)
    p, why = choice.pattern, choice.why
    assert (p, why_tag(why)) == (Pattern.GATHER, "nonfinite=skip") and "hierarchical sum, so gather" in why
    assert warmup_why(hvd_gradq.parse("orq:warmup=3").policy, 0, Pattern.GATHER) == "warm-up: step 1 of 3, then gather"
    assert why_tag(ONE_RANK_WHY) == "one rank"


# -- bytes ----------------------------------------------------------------------------------------
TENSORS = [("w1", 5000, "gather", 1900), ("w2", 512, "gather", 301), ("b1", 7, "fp32", None), ("w3", 4096, "scatter", 999)]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8, 64])
def test_bytes_against_horovods_ring_allreduce_at_any_world_size(nranks: int) -> None:
    st = Stats()
    st.begin_step()
    for name, n, pattern, sent in TENSORS:
        st.decide(name, pattern, "why", n, nranks)
        s = ring(n, nranks, 4) if sent is None else sent * (nranks - 1)  # fp32: Horovod's own ring
        st.record(name, s, s + 1)
    out = st.summary()
    for name, n, _, _ in TENSORS:
        t = out["tensors"][name]
        assert (t["fp32"], t["fp16"], t["elements"], t["ranks"]) == (ring(n, nranks, 4), ring(n, nranks, 2), n, nranks)
    a = out["last_step"]["all"]
    sent = sum(ring(n, nranks, 4) if s is None else s * (nranks - 1) for _, n, _, s in TENSORS)
    fp32, fp16 = (sum(ring(n, nranks, k) for _, n, _, _ in TENSORS) for k in (4, 2))
    assert (a["sent"], a["received"], a["fp32"], a["fp16"], a["tensors"]) == (sent, sent + 4, fp32, fp16, 4)
    if nranks == 1:  # nothing moves either way
        assert a["vs_fp32_allreduce"] == a["vs_fp16_allreduce"] == a["ratio_vs_fp32"] == 1.0
    else:
        assert a["vs_fp32_allreduce"] == pytest.approx(fp32 / sent) and a["ratio_vs_fp32"] == a["vs_fp32_allreduce"]
        assert a["vs_fp16_allreduce"] == pytest.approx(fp16 / sent)
    if nranks in (2, 4):  # 2(N-1)/N x 4 is even there (4n, 6n): fp16 is exactly half
        assert 2 * a["fp16"] == a["fp32"]
    assert out["last_step"]["gather"]["tensors"] == 2 and out["last_step"]["scatter"]["sent"] == 999 * (nranks - 1)
    assert out["total"] == out["last_step"]


def test_last_step_is_the_latest_and_total_adds_every_step() -> None:
    st = Stats()
    for step, sent in enumerate((100, 40, 70), 1):
        assert st.begin_step() == step
        st.decide("w", "gather", "auto", 1000, 2)
        st.record("w", sent, sent)
        if step == 2:
            st.decide("b", "fp32", "no saving", 3, 2)  # a tensor seen in one step only
            st.record("b", 12, 12)
    out = st.summary(world={"ranks": 2})
    assert out["steps"] == 3 and out["world"] == {"ranks": 2}
    assert out["last_step"]["all"]["sent"] == 70 and set(out["last_step"]) == {"all", "gather"}
    assert out["total"]["all"]["sent"] == 100 + 40 + 70 + 12 and out["total"]["all"]["tensors"] == 4
    assert out["total"]["gather"]["fp32"] == 3 * ring(1000, 2, 4)
    # a frontend that counts from static sizes records a tensor's steps at once (TensorFlow)
    view = st.fresh()
    view.record("w", 70, 70, steps=5)
    assert view.summary()["total"]["all"]["sent"] == 350 and view.clock is st.clock
    assert st.summary()["total"]["all"]["sent"] == 222, "fresh() must not touch the original's bytes"


def test_ratio() -> None:
    assert ratio(400, 100) == 4.0 and ratio(0, 0) == 1.0 and ratio(5, 0) == float("inf")


# -- time -----------------------------------------------------------------------------------------
def test_clock_opened_steps_and_timed_blocks() -> None:
    c = Clock()
    c.add("encode", 0.5)  # before any step: step 0
    assert c.open() == 1
    c.add("encode", 0.25)
    with c.timed("wait"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), c.timed("decode"):  # counted when it raises, too
        raise RuntimeError
    assert c.open() == 2
    c.add("decode", 1.0)
    one = c.step(1)
    assert one.encode == 0.25 and 0.02 <= one.wait < 1.0 and one.decode > 0
    assert (c.last().decode, c.steps) == (1.0, 2)
    assert c.total.encode == 0.75 and c.total.decode == pytest.approx(1.0 + one.decode)
    assert c.step(7).encode == 0.0
    with pytest.raises(ValueError, match="unknown kinds"):
        Clock(("encode", "lunch"))


def test_clock_named_steps_land_in_their_own_step() -> None:
    """TensorFlow names the step of each host call; calls of step 2 may come before step 1's last."""
    c = Clock(("encode", "decode"))
    assert c.add("encode", 1.0, step=1) is True
    assert c.add("encode", 2.0, step=2) is True  # step 2 began: step 1 is over
    assert c.add("decode", 4.0, step=1) is False  # late, still step 1's
    assert c.add("decode", 8.0, step=2) is False
    assert (c.step(1).encode, c.step(1).decode, c.step(2).encode, c.step(2).decode) == (1.0, 4.0, 2.0, 8.0)
    assert c.steps == 2 and c.total.decode == 12.0
    for k in range(3, 10):
        c.add("encode", 1.0, step=k)
    assert c.step(1).encode == 0.0 and c.step(9).encode == 1.0, "old steps are dropped, recent ones kept"


def test_clock_from_many_threads() -> None:
    c = Clock()
    c.open()

    def work() -> None:
        for _ in range(2000):
            c.add("decode", 0.5)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.total.decode == c.step(1).decode == 8 * 2000 * 0.5


# -- metrics --------------------------------------------------------------------------------------
class _Compressor(Reports):
    def __init__(self, stats: Stats) -> None:
        self._telemetry = stats


def test_metrics_are_a_flat_dict_of_numbers_for_the_last_step() -> None:
    st = Stats()
    st.begin_step()
    st.decide("w", "gather", "auto: ...", 1000, 2)
    st.record("w", 500, 500)
    st.decide("b", "fp32", "no saving: ...", 3, 2)
    st.record("b", 12, 12)
    st.clock.add("encode", 0.003)
    comp = _Compressor(st)
    m = comp.metrics()
    assert comp.stats() == st.summary()
    assert all(k.startswith("hvd_gradq/") for k in m)
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())
    assert m["hvd_gradq/bytes_sent"] == 512 and m["hvd_gradq/bytes_fp32_allreduce"] == 4012
    assert m["hvd_gradq/bytes_fp16_allreduce"] == 2006 and m["hvd_gradq/vs_fp16_allreduce"] == 2006 / 512
    assert m["hvd_gradq/encode_ms"] == pytest.approx(3.0) and m["hvd_gradq/compressor_ms"] == 0.0
    assert (m["hvd_gradq/tensors_gather"], m["hvd_gradq/tensors_fp32"], m["hvd_gradq/step"]) == (1, 1, 1)
    assert set(flat_metrics(st.summary(), "")) == {k[len("hvd_gradq/"):] for k in m}
    assert tally(st.summary()["tensors"]) == {"gather": {"auto": 1}, "fp32": {"no saving": 1}}


# -- the log --------------------------------------------------------------------------------------
# Each case runs in a fresh interpreter: the scenario is a process whose application configured no
# logging, which pytest's own handlers (attached even to non-propagating loggers) cannot show.
def _summary() -> dict[str, Any]:
    st = Stats()
    st.begin_step()
    for name, n, pattern, why, sent in (("w1", 5000, "gather", "auto: gather 1 ms at 10 Gbit/s", 1900),
                                        ("w2", 512, "gather", "auto: gather 3 us at 10 Gbit/s", 301),
                                        ("b1", 7, "fp32", "no saving: ...", 28), ("b2", 9, "fp32", "warm-up: ...", 36)):
        st.decide(name, pattern, why, n, 2)
        st.record(name, sent, sent)
    st.clock.add("encode", 0.0042)
    st.clock.add("decode", 2.5)
    return st.summary({"scheme": parse_scheme("orq:levels=3").spec, "pattern": "auto", "ranks": 2, "hosts": 1,
                       "ranks_a_host": 1, "link_gbps": 10.0})


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with ``S``, a summary, and ``log`` imported."""
    prelude = f"import json, logging\nfrom hvd_gradq import log\nS = json.loads({json.dumps(json.dumps(_summary()))})\n"
    e = {k: v for k, v in os.environ.items() if k != log.ENV}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          env=e, timeout=120)


STEPS = """
    log.first_step(S, RANK)
    S["steps"] = 7
    log.step(S, RANK)  # per step: DEBUG, off by default
    print(log.wants_steps(RANK))
    log.logger.warning("a warning shows on every rank")
"""


def test_first_step_line_on_rank_0_not_on_the_others() -> None:
    r1, r0 = (_run(f"RANK = {rank}\n" + textwrap.dedent(STEPS)) for rank in (1, 0))
    assert r1.returncode == r0.returncode == 0, r1.stderr + r0.stderr
    assert r1.stderr.splitlines() == ["hvd_gradq WARNING: a warning shows on every rank"]
    assert r0.stdout == r1.stdout == "False\n"
    line, warning = r0.stderr.splitlines()
    assert warning == "hvd_gradq WARNING: a warning shows on every rank"
    assert line.startswith("hvd_gradq INFO: first step: orq:levels=3 (pattern=auto), 2 ranks on 1 host; "
                           "cost model: 10 Gbit/s, 1 rank a host; 4 tensors: ")
    assert re.search(r"gather 2 \(auto\), fp32 2 \(1 (no saving, 1 warm-up|warm-up, 1 no saving)\)", line), line
    assert "sent 2.27 kB, Horovod's fp32 allreduce 22.1 kB (x9.76), fp16 11.1 kB (x4.88)" in line, line
    assert "time encode 4.2 ms, wait 0 us, decode 2.5 s, in compress/decompress 0 us" in line, line


def test_hvd_gradq_log_sets_the_level_on_every_rank() -> None:
    r = _run("RANK = 3\n" + textwrap.dedent(STEPS), {log.ENV: "DEBUG"})
    assert r.returncode == 0 and r.stdout == "True\n", r.stderr
    lines = r.stderr.splitlines()
    assert [ln.split(":")[:2] for ln in lines[:2]] == [["hvd_gradq INFO", " first step"], ["hvd_gradq DEBUG", " step 7"]]
    r = _run("RANK = 0\n" + textwrap.dedent(STEPS), {log.ENV: "warning"})
    assert r.stderr.splitlines() == ["hvd_gradq WARNING: a warning shows on every rank"]
    r = _run("log.env_level()", {log.ENV: "loud"})
    assert "HVD_GRADQ_LOG='loud' is not a log level; use one of debug, info, warning, error" in r.stderr


def test_an_application_that_configured_logging_keeps_its_handlers() -> None:
    r = _run("""
        import sys
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="app %(name)s %(message)s")
        log.first_step(S, 1)  # rank 1: shown, the application asked for INFO
        print(log.logger.handlers, log.logger.level)
    """)
    out = r.stdout.splitlines()
    assert r.stderr == "" and out[0].startswith("app hvd_gradq first step: orq:levels=3") and out[1] == "[] 0", r


def test_log_every_k_steps_on_rank_0() -> None:
    r0, r1 = (_run(f"""
        made = []
        def summary():
            made.append(1)
            return S
        for k in range(1, 8):
            log.step_done(k, {rank}, 3, summary)
        print(len(made))
    """) for rank in (0, 1))
    lines = r0.stderr.splitlines()
    assert [ln.split(":")[1].strip() for ln in lines] == ["first step", "step 3", "step 6"], r0.stderr
    assert lines[1].startswith("hvd_gradq INFO: step 3: orq:levels=3 (pattern=auto), 2 ranks on 1 host; ")
    assert r0.stdout == "3\n", "a summary is made only where a line is due"
    assert r1.stderr == "" and r1.stdout == "0\n", "other ranks: warnings only"
    r = _run("for k in range(1, 4): log.step_done(k, 0, 0, lambda: S)", {log.ENV: "debug"})
    assert [ln.split(":")[1].strip() for ln in r.stderr.splitlines()] == ["first step", "step 2", "step 3"]


def test_log_every_from_the_option_or_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(log.EVERY_ENV, raising=False)
    assert log.resolve_every() == 0 and log.resolve_every(50) == 50
    monkeypatch.setenv(log.EVERY_ENV, "200")
    assert log.resolve_every() == 200 and log.resolve_every(0) == 0  # the option wins
    monkeypatch.setenv(log.EVERY_ENV, "often")
    with pytest.raises(hvd_gradq.GradqError, match=r"HVD_GRADQ_LOG_EVERY='often' is not a step count"):
        log.resolve_every()
    for bad in (-1, 2.5, True):
        with pytest.raises(hvd_gradq.GradqError, match=r"log_every=.* is not a step count: give a whole number"):
            log.resolve_every(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("world,said", [
    ({"ranks": 2, "hosts": 1, "ranks_a_host": 1}, "2 ranks on 1 host; cost model: 10 Gbit/s, 1 rank a host"),
    ({"ranks": 8, "hosts": 2, "ranks_a_host": 4}, "8 ranks on 2 hosts of 4; cost model: 10 Gbit/s, 4 ranks a host"),
    ({"ranks": 2, "hosts": 2, "ranks_a_host": 1}, "2 ranks on 2 hosts; cost model: 10 Gbit/s, 1 rank a host"),
    ({"ranks": 1, "hosts": 1, "ranks_a_host": 1}, "1 rank on 1 host; cost model: 10 Gbit/s, 1 rank a host"),
    ({"ranks": 6, "hosts": None, "ranks_a_host": 1}, "6 ranks on hosts not alike; cost model: 10 Gbit/s, 1 rank a host"),
    ({"ranks": 2, "ranks_a_host": 1}, "2 ranks; cost model: 10 Gbit/s, 1 rank a host"),
])
def test_where_the_ranks_run_in_words_a_user_counts(world: dict[str, Any], said: str) -> None:
    # two ranks on one machine once read "on 2 ranks, 1 a host"; the cost model's view is apart
    assert placement({**world, "link_gbps": 10.0}) == said
    # a rate the handshake measured (frontend/link.py) says so
    measured = {**world, "link_gbps": 0.94123, "link": "measured: 0.941 Gbit/s (allgather ...)"}
    assert placement(measured) == said.replace("10 Gbit/s", "0.941 Gbit/s (measured)")


@pytest.mark.parametrize("frontend,threads,share,setting", [
    ("torch", 2, 1, "OMP_NUM_THREADS=1"), ("tensorflow", 8, 2, "TF_NUM_INTRAOP_THREADS=2"),
    ("torch", 1, 1, None), ("torch", 4, 4, None), ("torch", None, 2, None)])
def test_the_line_says_when_the_frameworks_threads_oversubscribe_the_cores(
        frontend: str, threads: int | None, share: int, setting: str | None) -> None:
    said = crowding({"frontend": frontend, "intra_op_threads": threads, "rank_cores": share})
    if setting is None:
        assert said == ""
    else:
        assert f"oversubscribed: {frontend} runs {threads} intra-op threads in each rank" in said
        assert f"share of the host's cores is {share}: set {setting}" in said


def test_summary_is_a_short_table_of_the_same_figures() -> None:
    st = Stats()
    for _ in range(2):
        st.begin_step()
        for name, n, pattern, why, sent in (("w1", 5000, "gather", "auto: gather 1 ms at 10 Gbit/s", 1900),
                                            ("w2", 512, "gather", "auto: gather 3 us at 10 Gbit/s", 301),
                                            ("b1", 7, "fp32", "no saving: ...", 28), ("b2", 9, "fp32", "warm-up: ...", 36)):
            st.decide(name, pattern, why, n, 2)
            st.record(name, sent, sent)
        for kind, took in zip(KINDS, (0.004, 0.001, 0.002, 0.008)):
            st.clock.add(kind, took)
    world = {"frontend": "torch", "scheme": parse_scheme("orq:levels=3").spec, "pattern": "auto", "ranks": 2,
             "hosts": 1, "ranks_a_host": 1, "link_gbps": 10.0}
    comp = _Compressor(st)
    comp._telemetry = _Telemetry(st, world)
    text = comp.summary()
    lines = text.splitlines()
    assert len(lines) <= 10 and len(text) < 1000, text
    assert lines[0] == "hvd_gradq: orq:levels=3 (pattern=auto), 2 ranks on 1 host; cost model: 10 Gbit/s, " \
                       "1 rank a host; 2 steps"
    rows = {ln.split()[0]: ln.strip() for ln in lines[3:6]}
    assert list(rows) == ["gather", "fp32", "all"], text  # the most elements first
    assert re.fullmatch(r"gather\s+2\s+5,512\s+2.2 kB\s+22 kB \(x10\)\s+11 kB \(x5.01\)\s+auto 2", rows["gather"])
    assert re.fullmatch(r"fp32\s+2\s+16\s+64 B\s+64 B \(x1\)\s+32 B \(x0.5\)\s+(no saving 1, warm-up 1|"
                        r"warm-up 1, no saving 1)", rows["fp32"]), rows["fp32"]
    assert re.fullmatch(r"all\s+4\s+5,528\s+2.27 kB\s+22.1 kB \(x9.76\)\s+11.1 kB \(x4.88\)", rows["all"])
    assert lines[6] == "time, last step: encode 4 ms, wait 1 ms, decode 2 ms, in compress/decompress 8 ms"
    assert lines[7] == ("time, mean a step over 2 steps (the first's one-time compiling included): encode 4 ms, "
                        "wait 1 ms, decode 2 ms, in compress/decompress 8 ms")
    assert lines[8] == "in total: sent 4.53 kB, Horovod's fp32 allreduce 44.2 kB (x9.76), fp16 22.1 kB (x4.88)"
    # TensorFlow names its compressor time for what it is
    comp._telemetry = _Telemetry(st, {**world, "frontend": "tensorflow"})
    assert "in its host functions 8 ms" in comp.summary()


class _Telemetry:
    def __init__(self, stats: Stats, world: dict[str, Any]) -> None:
        self.stats, self.world = stats, world

    def summary(self) -> dict[str, Any]:
        return self.stats.summary(self.world)


def test_short_spec() -> None:
    assert log.short_spec(parse_scheme("orq:levels=5").spec) == "orq"
    assert log.short_spec(hvd_gradq.parse("orq:levels=3,ef=true").spec) == "orq:levels=3,ef=true"
    assert log.short_spec("orq:ef=true,levels=3,bucket=512") == "orq:levels=3,ef=true"  # the canonical order
    assert log.short_spec(parse_scheme("bingrad").spec) == "bingrad"
    assert log.short_spec("nosuch:x=1") == "nosuch:x=1"
