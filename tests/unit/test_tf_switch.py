"""TensorFlow's plan switch (hvd_gradq.tensorflow.switch) on its own: when a step starts, which
branch a gradient takes, and what each branch's steps cost in bytes. The trial's own rules are
tests/unit/test_trial.py's; the switch in a real 2-rank job is tests/parallel/test_tf_trial.py's."""
from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("tensorflow")

from hvd_gradq.plan.decide import Choice  # noqa: E402
from hvd_gradq.plan.pattern import Pattern  # noqa: E402
from hvd_gradq.policy import Policy  # noqa: E402
from hvd_gradq.reduce.stats import Stats  # noqa: E402
from hvd_gradq.tensorflow import switch as sw  # noqa: E402
from hvd_gradq.tensorflow.slots import Slot  # noqa: E402

GATHER = Choice(Pattern.GATHER, "auto: gather")


class Core:
    """What the switch reads of a compressor: a scripted plan, the step starts it was handed."""

    def __init__(self, warmup: int = 0) -> None:
        self.policy = Policy(warmup=warmup)
        self.plan: Pattern | None = None  # None: the model's choice (the compressed plan)
        self.starts = 0
        self.trial = object()

    def trial_step(self, key: Any, size: int, gather: Any) -> None:
        self.starts += 1

    def planned(self, name: str, n: int, ndim: int, size: int, local: int, model: Choice) -> Choice:
        return model if self.plan is None else Choice(self.plan, f"measured: {self.plan.value}")

    def warm_note(self, choice: Choice) -> str:
        return choice.why


def slot(key: str, n: int = 1000, sent: int = 123, received: int = 456) -> Slot:
    return Slot(0, key, None, (n,), "float32", n, 2, GATHER, None, None, None, sent, received, 4 * n)


def test_a_step_starts_at_the_first_callback_after_one_of_the_same_gradient() -> None:
    core = Core()
    s = sw.Switch(core, Stats())  # type: ignore[arg-type]
    a, b, c = slot("a"), slot("b"), slot("c")
    for order in ([a, b, c], [c, a, b], [b, c]):  # the executor's order varies; a gradient may skip a step
        for x in order:
            s._pick(x, 0, 2, 1, None, 5)
    # starts: a (first ever); c (a new step: c ran in the first); b (b ran in the second)
    assert core.starts == 3


def test_each_plan_takes_its_branch_and_stats_show_it() -> None:
    core, stats = Core(warmup=2), Stats()
    s = sw.Switch(core, stats)  # type: ignore[arg-type]
    a = slot("a")
    got = []
    for step, plan in enumerate([None, Pattern.FP16, None, Pattern.FP16, Pattern.FP32, None]):
        core.plan = plan
        got.append(s._pick(a, 0, 2, 1, None, step))
        if step >= 2:
            assert stats.tensors["a"].pattern == (plan or Pattern.GATHER).value
    # the policy's warm-up comes first whatever the plan; then the plan's branch
    assert got == [sw.WARM, sw.WARM, sw.COMPRESSED, sw.FP16, sw.FP32, sw.COMPRESSED]


def test_bytes_are_priced_by_the_branch_each_step_ran() -> None:
    core = Core(warmup=1)
    s = sw.Switch(core, Stats())  # type: ignore[arg-type]
    n, a = 1000, slot("a", n=1000)
    assert s.rows(a, True) is None  # not run yet
    for step, plan in enumerate([None, None, Pattern.FP16, Pattern.FP16, Pattern.FP32, None]):
        core.plan = plan
        s._pick(a, 0, 2, 1, None, step)
    rows = s.rows(a, True)
    assert rows is not None
    # 2 ranks: a ring sends (N-1)/N of the tensor twice: n elements' bytes a rank, fp16 half
    assert rows[-1] == ("gather", 123, 456, 2)  # the last step's branch last: the live decision's
    assert sorted(rows[:-1]) == [("fp16", 2 * n, 2 * n, 2), ("fp32", 4 * n, 4 * n, 1), ("fp32", 4 * n, 4 * n, 1)]
    assert s.rows(a, False) == [("gather", 123, 456, 1)]  # the log's one step: the last
