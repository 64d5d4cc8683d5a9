"""auto's measured choice under horovodrun (hvd_gradq.plan.trial; issue: measured, not modelled)."""
import pytest
from harness import launch

pytestmark = pytest.mark.parallel


def test_the_trial_ends_with_one_plan_on_every_rank_and_says_what_it_measured() -> None:
    reps = launch("worker_torch_trial.py", np=2, args=["--mode", "trial"], timeout=400)
    a, b = reps[0], reps[1]
    assert a["plans"] == b["plans"], "the ranks took different plans at some step"
    assert a["digest"] == b["digest"], "weights differ across ranks"
    auto = a["auto"]
    assert auto["phase"] == "chosen" and auto["trials"] >= 1, auto
    assert auto["plan"] in ("compressed", "fp16", "mixed", "fp32")
    assert a["plans"][-1] == auto["plan"]
    assert set(a["plans"][:2]) == {"compressed"}, "the first steps run the compressed plan"
    timed = {p: c for p, c in auto["candidates"].items() if c["measured_s"] is not None}
    assert "compressed" in timed and "fp16" in timed, auto["candidates"]  # both are always raced
    for p, c in auto["candidates"].items():
        assert c["model_s"] is not None and c["model_s"] >= 0  # the model's prediction beside each
        assert (c["measured_s"] is None) == (c["timed_steps"] == 0)
        assert c["measured_s"] is not None or c["skipped"], f"{p}: neither timed nor said why not"
    assert 0 < auto["cost_s"] and auto["history"]
    # the trial's log line, on rank 0 only: each candidate, the model beside it, the plan taken
    assert f"-> plan {auto['plan']}" in a["log"] and "(model " in a["log"], a["log"]
    assert "-> plan" not in b["log"]
    # the tensors' patterns in stats() follow the plan taken
    patterns = set(a["tensors"].values())
    if auto["plan"] == "fp16":
        assert patterns == {"fp16"}
    elif auto["plan"] == "fp32":
        assert patterns == {"fp32"}


@pytest.mark.parametrize("pattern", ["gather", "scatter"])
def test_error_feedback_across_a_switch_delivers_each_residual_once(pattern: str) -> None:
    reps = launch("worker_torch_trial.py", np=2, args=["--mode", "switch"], timeout=300)
    own, reduced = "0.weight", "0.weight#reduce"
    for r, rep in reps.items():
        steps = rep[pattern]["steps"]
        for k, s in enumerate(steps):
            if s["plan"] in ("fp32", "fp16"):
                assert s["pattern"] == s["plan"]
                assert own in s["held"], f"rank {r} step {k}: no residual to deliver: the check would be empty"
                if pattern == "scatter":
                    assert reduced in s["held"], s
                tol = 1e-6 if s["plan"] == "fp32" else 2.0**-9
                assert s["err"] <= tol * s["scale"], f"rank {r} step {k} ({s['plan']}): {s['err']} vs {s['scale']}"
                assert s["stock_equal"], f"rank {r} step {k}: not stock Horovod's {s['plan']} allreduce, bit for bit"
                assert s["after"] == [], f"rank {r} step {k}: residuals kept after they were delivered: {s['after']}"
                nxt = steps[k + 1]
                assert nxt["plan"] == "compressed" and nxt["held"] == [], "the next compressed step must start from zero"
                assert own in nxt["after"]
            else:
                assert s["pattern"] == pattern
                assert own in s["after"]
    assert reps[0][pattern]["digest"] == reps[1][pattern]["digest"]
