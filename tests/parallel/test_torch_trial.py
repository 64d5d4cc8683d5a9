"""auto's measured choice under horovodrun (hvd_gradq.plan.trial; issue: measured, not modelled)."""
import pytest
from harness import launch
from trial_checks import check_trial

pytestmark = pytest.mark.parallel


def test_the_trial_ends_with_one_plan_on_every_rank_and_says_what_it_measured() -> None:
    reps = launch("worker_torch_trial.py", np=2, args=["--mode", "trial"], timeout=400)
    a, b = reps[0], reps[1]
    auto = check_trial(a, b)
    # what each tensor's reduction added after backward, under each plan the trial timed
    for plan, c in auto["candidates"].items():
        if c["timed_steps"]:
            assert c["after_backward_s"] is not None and c["after_backward_s"] > 0, (plan, c)
            assert c["slowest"] and {k for k, _ in c["slowest"]} <= set(a["tensors"]), (plan, c["slowest"])
            assert [s for _, s in c["slowest"]] == sorted((s for _, s in c["slowest"]), reverse=True)
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
