"""TensorFlow's plan switch (hvd_gradq.tensorflow.switch) on its own: when a step starts, which
branch a gradient takes, and what each branch's steps cost in bytes. The trial's own rules are
tests/unit/test_trial.py's; the switch in a real 2-rank job is tests/parallel/test_tf_trial.py's."""
from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("tensorflow")

from hvd_gradq.plan.decide import Choice
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.policy import Policy
from hvd_gradq.reduce.stats import Stats
from hvd_gradq.tensorflow import switch as sw
from hvd_gradq.tensorflow.slots import Slot

GATHER = Choice(Pattern.GATHER, "auto: gather")


class Core:
    """What the switch reads of a compressor: a scripted plan, the step starts it was handed."""

    def __init__(self) -> None:
        self.policy = Policy()
        self.plan: Pattern | None = None  # None: the model's choice (the compressed plan)
        self.starts = 0
        self.trial = object()

    def trial_step(self, key: Any, size: int, gather: Any) -> None:
        self.starts += 1

    def planned(self, name: str, n: int, ndim: int, size: int, local: int, model: Choice) -> Choice:
        if self.plan is None or (self.plan is Pattern.GATHER and name == "big"):  # GATHER: "mixed" here
            return model
        return Choice(Pattern.FP16 if self.plan is Pattern.GATHER else self.plan, "measured: ...")

    def warm_note(self, choice: Choice) -> str:
        return choice.why


def slot(index: int, key: str, n: int = 1000, sent: int = 123, received: int = 456) -> Slot:
    return Slot(index, key, None, (n,), "float32", n, 2, GATHER, None, None, None, sent, received, 4 * n)


def function(*slots: Slot) -> Any:
    return sw._Function(0, 2, 1, None, list(slots))


def test_each_step_starts_once_and_gives_every_gradient_its_plans_branch() -> None:
    core, stats = Core(), Stats()
    s = sw.Switch(core, stats)  # type: ignore[arg-type]
    fn = function(slot(0, "big"), slot(2, "small"))  # slot 1: not switched (another function, or fp32)
    got = []
    for plan in (None, Pattern.FP16, Pattern.GATHER, Pattern.FP32, None):
        core.plan = plan
        got.append(list(s._start(fn)))
        want = {None: "gather", Pattern.FP16: "fp16", Pattern.GATHER: "fp16", Pattern.FP32: "fp32"}[plan]
        assert stats.tensors["small"].pattern == want  # stats() shows the branch each gradient took
    assert core.starts == 5  # one step start a call of the traced function
    C, H, F = sw.COMPRESSED, sw.FP16, sw.FP32
    assert got == [[C, C, C], [H, C, H], [C, C, H], [F, C, F], [C, C, C]]


def test_only_the_first_uncompressed_step_delivers_residuals() -> None:
    # a gradient with error feedback flushes its residuals at the first fp16/fp32 step after a
    # compressed one; the next uncompressed steps take the PLAIN branches, which touch none
    core = Core()
    s = sw.Switch(core, Stats())  # type: ignore[arg-type]
    a, b = slot(0, "a"), slot(1, "b")  # b: no plain branches (no error feedback)
    s._plain.add("a")
    fn = function(a, b)
    got = []
    for plan in (Pattern.FP16, None, Pattern.FP16, Pattern.FP16, Pattern.FP32, None, Pattern.FP32, Pattern.FP32):
        core.plan = plan
        got.append(list(s._start(fn)))
    C, H, F, PH, PF = sw.COMPRESSED, sw.FP16, sw.FP32, sw.PLAIN16, sw.PLAIN32
    assert [r[0] for r in got] == [H, C, H, PH, PF, C, F, PF]
    assert [r[1] for r in got] == [H, C, H, H, F, C, F, F]
    # a plain step's bytes are its flushing twin's
    assert s.rows(a, True) == [("gather", 123, 456, 2), ("fp16", 2000, 2000, 3), ("fp32", 4000, 4000, 3)]


def test_bytes_are_priced_by_the_branch_each_step_ran() -> None:
    core = Core()
    s = sw.Switch(core, Stats())  # type: ignore[arg-type]
    n, a = 1000, slot(0, "a", n=1000)
    fn = function(a)
    assert s.rows(a, True) is None  # not run yet
    for plan in [None, None, Pattern.FP16, Pattern.FP16, Pattern.FP32, None]:
        core.plan = plan
        s._start(fn)
    # 2 ranks: a ring sends (N-1)/N of the tensor twice: n elements' bytes a rank, fp16 half
    assert s.rows(a, True) == [("fp16", 2 * n, 2 * n, 2), ("fp32", 4 * n, 4 * n, 1), ("gather", 123, 456, 3)]
    assert s.rows(a, False) == [("gather", 123, 456, 1)]  # the log's one step: the last


def test_horovods_operand_carries_nan_only_for_schemes_without_bucket_scales() -> None:
    from hvd_gradq import parse
    from hvd_gradq.schemes.options import NonFinite

    # a level scheme's scale per bucket carries NaN (sign's too); top-k sends values, no scale
    for spec, carries in (("orq", False), ("uniform:bits=4", False), ("fp16", False), ("sign", False),
                          ("topk:ratio=0.1", True)):
        config = parse(spec)
        assert sw.operand_carries_nan(config.scheme, config.policy) is carries, spec
    raising = parse("topk:ratio=0.1,nonfinite=raise")  # the pattern's own collectives stop the step instead
    assert raising.policy.nonfinite is NonFinite.RAISE and not sw.operand_carries_nan(raising.scheme, raising.policy)
