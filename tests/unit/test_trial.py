"""The measured choice's state machine (hvd_gradq.plan.trial), driven by scripted step times.

A simulated job: each step takes its plan's time (plus a first-step extra after a switch),
ranks exchange rows and take the maximum, exactly as the frontends do. The oracle is the
scripted times themselves: which plan is fastest, and what the trial's steps cost beyond it."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from hvd_gradq.plan import trial as tr
from hvd_gradq.plan.trial import COMPRESSED, FP16, FP32, MIXED, Phase, Trial, large_set

Times = Callable[[str, int], float]  # (plan, step) -> seconds on this rank


def simulate(trials: list[Trial], times: list[Times], steps: int, switch_extra: float = 0.0) -> list[list[str]]:
    """Run ``steps`` steps of ranks (one Trial and one clock each); returns each rank's plan a step.
    A step's time is the slowest rank's (a collective waits for it), as in a real job."""
    now = 0.0
    plans: list[list[str]] = [[] for _ in trials]
    previous = None
    for k in range(steps):
        rows = [t.begin(now) for t in trials]
        assert all((r is None) == (rows[0] is None) for r in rows), "ranks must exchange at the same steps"
        if rows[0] is not None:
            top = np.max(np.stack([r for r in rows if r is not None]), axis=0)
            for t in trials:
                t.agreed(top)
        for i, t in enumerate(trials):
            plans[i].append(t.plan)
        plan = trials[0].plan
        assert all(t.plan == plan for t in trials), f"step {k}: ranks took different plans"
        now += max(f(plan, k) for f in times) + (switch_extra if plan != previous else 0.0)
        previous = plan
    return plans


def flat(table: dict[str, float]) -> Times:
    return lambda plan, step: table[plan]


def sized(trial: Trial, sizes: dict[str, int]) -> Trial:
    for name, n in sizes.items():
        trial.saw(name, n, compressed=True)
    return trial


FEW_LARGE = {"conv.big": 1_000_000, **{f"bn.{i}": 64 for i in range(30)}}  # one tensor holds nearly all


def test_keeps_compressed_where_it_is_fastest_and_stops_a_slow_plan_at_once() -> None:
    t = sized(Trial(), FEW_LARGE)
    plans = simulate([t], [flat({COMPRESSED: 1.0, FP16: 1.6, MIXED: 1.2, FP32: 3.0})], 60)[0]
    assert t.phase is Phase.CHOSEN and t.plan == COMPRESSED
    assert plans.count(FP32) == tr.SETTLE + 1, "3x the best at its first timed step: out at once"
    assert t.candidates[FP32].skipped.startswith("ruled out at its first timed step")
    assert t.candidates[FP16].skipped.startswith("ruled out after 2 timed steps")  # one block: 1.6 >= 1.5 x 1.0
    assert t.candidates[MIXED].median == pytest.approx(1.2)
    assert plans[: t.start] == [COMPRESSED] * t.start


def test_takes_fp16_where_it_is_faster_than_the_margin() -> None:
    t = sized(Trial(), FEW_LARGE)
    simulate([t], [flat({COMPRESSED: 1.0, FP16: 0.9, MIXED: 0.95, FP32: 0.92})], 60)
    assert t.plan == FP16 and t.why.startswith("fp16 measured fastest")
    assert t.candidates[FP32].median == pytest.approx(0.92)


def test_hysteresis_keeps_the_incumbent_within_the_margin() -> None:
    t = sized(Trial(), FEW_LARGE)
    simulate([t], [flat({COMPRESSED: 1.0, FP16: 0.98, MIXED: 0.99, FP32: 1.5})], 60)
    assert t.plan == COMPRESSED and "kept" in t.why


def test_mixed_is_skipped_where_the_large_tensors_are_most_of_them() -> None:
    t = sized(Trial(), {f"w{i}": 1000 + i for i in range(10)})  # alike: 90% of elements needs 9 of 10
    plans = simulate([t], [flat({COMPRESSED: 1.0, FP16: 1.2, MIXED: 0.5, FP32: 2.0})], 40)[0]
    assert MIXED not in plans and t.candidates[MIXED].skipped


def test_large_set_holds_the_share_and_is_the_same_in_any_order() -> None:
    sizes = {"a": 50, "b": 30, "c": 10, "d": 5, "e": 5}
    assert large_set(sizes, 0.9) == {"a", "b", "c"}
    assert large_set(dict(reversed(list(sizes.items()))), 0.9) == {"a", "b", "c"}
    assert large_set({"x": 5, "y": 5}, 0.5) == {"x"}  # a tie goes by name


def test_ranks_with_different_clocks_take_the_same_plans() -> None:
    """Each rank's own times differ (rank 1 is slower under fp16); every decision reads the
    maximum, so the plans agree step for step (simulate asserts it) and follow the slower rank."""
    r0 = flat({COMPRESSED: 1.0, FP16: 0.8, MIXED: 0.9, FP32: 0.85})
    r1 = flat({COMPRESSED: 1.0, FP16: 1.3, MIXED: 0.9, FP32: 1.4})
    ranks = [sized(Trial(), FEW_LARGE), sized(Trial(), FEW_LARGE)]
    simulate(ranks, [r0, r1], 60)
    assert ranks[0].plan == ranks[1].plan == MIXED


def test_cost_is_each_trial_step_beyond_the_best_plan() -> None:
    table = {COMPRESSED: 1.0, FP16: 1.2, MIXED: 1.1, FP32: 3.0}
    t = sized(Trial(), FEW_LARGE)
    plans = simulate([t], [flat(table)], 40)[0]
    trial_steps = [p for k, p in enumerate(plans) if t.start <= k < t.start + len(t._trial_times)]
    # the trial's last row is the step before the plan is chosen: its steps are those timed
    assert t.cost == pytest.approx(sum(table[p] - 1.0 for p in trial_steps))
    # one round: a block (settle + 2 timed) of fp16 and of mixed, both then ruled out (no noise:
    # any gap beyond the margin is significant); fp32 out at its first timed step (3x the best)
    assert t.cost == pytest.approx(3 * 0.2 + 3 * 0.1 + 2 * 2.0)


def test_a_drift_runs_the_trial_again_and_the_budget_bounds_it() -> None:
    def times(plan: str, step: int) -> float:  # after step 300 the wire slows: fp16 loses
        base = {COMPRESSED: 1.0, FP16: 0.9, MIXED: 0.95, FP32: 0.95}
        if step >= 300:
            base = {COMPRESSED: 1.0, FP16: 2.0, MIXED: 1.3, FP32: 3.0}
        return base[plan]

    t = sized(Trial(), FEW_LARGE)
    plans = simulate([t], [times], 600)[0]
    assert plans[299] == FP16 and t.plan == COMPRESSED, "the drift must bring the trial back, and it must move"
    assert t.trials == 2 and "median step" in t.history[1]
    assert t.cost <= tr.BUDGET * 600 * 1.0


def test_no_trial_beyond_the_budget() -> None:
    """Step times that jump by more than the drift at every check: trials run only while their
    cost stays within the budget of the job's time."""
    def times(plan: str, step: int) -> float:
        return {COMPRESSED: 1.0, FP16: 3.0, MIXED: 2.0, FP32: 5.0}[plan] * (1.0 if (step // 20) % 2 else 1.5)

    t = sized(Trial(), FEW_LARGE)
    simulate([t], [times], 2000)
    assert t.trials >= 2
    assert t.cost <= tr.BUDGET * t.elapsed + t.last_cost  # the last one was allowed by what came before


def test_a_plan_that_holds_is_checked_less_often() -> None:
    t = sized(Trial(every=200), FEW_LARGE)  # cheap trials: the budget never holds one back here
    simulate([t], [flat({COMPRESSED: 1.0, FP16: 1.05, MIXED: 1.04, FP32: 1.2})], 1700)
    starts = [int(h.split("at step ")[1].split(" ")[0]) for h in t.history]
    gaps = np.diff(starts)
    assert len(starts) == 4 and all(b > 1.8 * a for a, b in itertools.pairwise(gaps)), starts
    assert t.plan == COMPRESSED


def test_nothing_compressed_means_nothing_to_compare_against() -> None:
    t = Trial()  # no tensor seen as compressed: compressed and mixed are the same as fp32's plans
    simulate([t], [flat({COMPRESSED: 1.0, FP16: 1.0, MIXED: 1.0, FP32: 0.9})], 40)
    assert t.candidates[COMPRESSED].skipped == "nothing to compress"
    assert t.plan in (FP16, FP32)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_steps_end_the_race_in_bounded_steps_alike_on_every_rank(seed: int) -> None:
    """Step times with 30% noise, different on each rank: the race still ends within its
    rounds (each a block of every live candidate), and every rank takes the same plans."""
    rng = [np.random.default_rng(seed * 2 + r) for r in range(2)]
    base = {COMPRESSED: 1.0, FP16: 1.02, MIXED: 0.99, FP32: 1.05}

    def noisy(r: int) -> Times:
        return lambda plan, step: base[plan] * float(rng[r].lognormal(0.0, 0.3))

    ranks = [sized(Trial(), FEW_LARGE), sized(Trial(), FEW_LARGE)]
    simulate(ranks, [noisy(0), noisy(1)], 200)
    t = ranks[0]
    assert t.trials >= 1 and t.history
    first = int(t.history[0].split("at step ")[1].split(" ")[0])
    assert first <= t.start + tr.ROUNDS * len(tr.PLANS) * (tr.SETTLE + tr.TIMED)
    assert all(len(c.times) <= tr.ROUNDS * tr.TIMED for c in t.candidates.values())


def test_fp32_wins_where_fp16_is_far_behind() -> None:
    """On loopback fp16's casts can cost more than its bytes save: fp32 is raced whatever fp16
    measured (fp16 here 1.6x the best), and taken where fastest."""
    t = sized(Trial(), FEW_LARGE)
    simulate([t], [flat({COMPRESSED: 1.3, FP16: 1.6, MIXED: 1.4, FP32: 1.0})], 60)
    assert t.plan == FP32, t.history


def test_what_each_tensor_added_after_backward_is_kept_by_the_plan_that_timed_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: the trial times whole steps, and where the frontend can say (PyTorch's
    telemetry) also what each tensor's reduction added after backward: stats()['auto'] gives
    its sum and the slowest tensors under each plan, from the timed steps only."""
    from hvd_gradq.frontend import measured as ms
    from hvd_gradq.plan.decide import Choice
    from hvd_gradq.plan.pattern import Pattern

    step_s = {COMPRESSED: 0.10, FP16: 0.12, MIXED: 0.11, FP32: 0.125}
    added = {COMPRESSED: {"a": 0.02, "b": 0.001}, FP16: {"a": 0.03, "b": 0.004}, MIXED: {"a": 0.02, "b": 0.003},
             FP32: {"a": 0.05, "b": 0.006}}
    clock = {"now": 0.0}
    monkeypatch.setattr(ms.time, "perf_counter", lambda: clock["now"])
    m = ms.Measured(Trial(start=2))
    model = Choice(Pattern.GATHER, "auto: gather")
    settle_seen = 0
    for _ in range(200):
        m.step("set", 2, lambda row, kind, timeout: row, 60.0, "test", dict)
        for name, n in (("a", 1 << 20), ("b", 1000), *((f"c{i}", 10) for i in range(4))):
            m.choose(name, n, 1, 2, 1, model)
        t = m.trial
        assert t is not None
        plan = t.plan
        timed = t.timing() is not None
        settle_seen += t.phase is Phase.TRIAL and not timed
        # a settling step's figures are far off: they must not be kept
        m.after_backward({k: v if timed else 9.0 for k, v in added[plan].items()})
        clock["now"] += step_s[plan]
        if t.phase is Phase.CHOSEN:
            break
    assert settle_seen > 0
    report = m.report(lambda *a: model, lambda *a: 0.0)
    assert report["phase"] == "chosen"
    for plan, c in report["candidates"].items():
        if c["timed_steps"] == 0:
            assert c["after_backward_s"] is None and c["slowest"] == []
            continue
        assert c["after_backward_s"] == pytest.approx(sum(added[plan].values()))
        assert [k for k, _ in c["slowest"]] == ["a", "b"]
        assert sum(len(v) for v in m.after[plan].values()) == 2 * c["timed_steps"]
