"""auto's measured choice in TensorFlow under horovodrun (hvd_gradq.plan.trial, hvd_gradq.tensorflow.switch)."""
import pytest
from harness import launch
from trial_checks import check_trial

pytestmark = pytest.mark.parallel
COMPRESSES = ("gather", "summable", "scatter", "hierarchical")


def test_the_trial_ends_with_one_plan_on_every_rank_and_says_what_it_measured() -> None:
    reps = launch("worker_tf_trial.py", np=2, args=["--mode", "trial"], timeout=500)
    a, b = reps[0], reps[1]
    auto = check_trial(a, b)
    assert a["trial_steps"] == a["steps"], "the trial counted steps that are not the training loop's"
    # the bytes follow the branches each gradient ran: every fp16 tensor-step is a switched
    # gradient's step under the fp16 plan, or under mixed outside the large set
    switched = [k for k, p in a["slots"] if p in COMPRESSES]
    assert switched, a["slots"]
    small = [k for k in switched if k not in a["large"]]
    want = a["plans"].count("fp16") * len(switched) + a["plans"].count("mixed") * len(small)
    assert a["by_pattern"].get("fp16", 0) == want, (a["by_pattern"], a["plans"])
    assert a["plans"].count("fp16") > 0, "fp16 was raced: its steps must show"
    patterns = {a["tensors"][k] for k in switched}
    if auto["plan"] in ("fp16", "fp32"):
        assert patterns == {auto["plan"]}, patterns
    elif auto["plan"] == "compressed":
        assert patterns <= set(COMPRESSES), patterns


@pytest.fixture(scope="module")
def switched() -> dict:
    return launch("worker_tf_trial.py", np=2, args=["--mode", "switch"], timeout=400)


@pytest.mark.parametrize("pattern", ["gather", "scatter"])
def test_error_feedback_across_a_switch_delivers_each_residual_once(switched: dict, pattern: str) -> None:
    for r, rep in switched.items():
        steps = rep[pattern]["steps"]
        for k, s in enumerate(steps):
            if s["plain"]:  # the previous step delivered every residual: this one sends the gradient alone
                assert s["pattern"] == s["plan"]
                assert s["held_bits"], f"rank {r} step {k}: a residual the step had no use for was changed"
                assert s["after"] == [s["own"]], f"rank {r} step {k}: {s['after']}"
                assert s["err"] <= (2.0**-23 if s["plan"] == "fp32" else 2.0**-10) * s["scale"], s
                assert s["stock_equal"], f"rank {r} step {k}: not stock Horovod's {s['plan']} allreduce, bit for bit"
                assert steps[k + 1]["plan"] != "compressed" or steps[k + 1]["held"] == [s["own"]]
            elif s["plan"] in ("fp32", "fp16"):
                assert s["pattern"] == s["plan"]
                assert s["own"] is not None, f"rank {r} step {k}: no residual to deliver: the check would be empty"
                if pattern == "scatter":
                    assert any(h.endswith("#reduce") for h in s["held"]), s
                tol = 2.0**-23 if s["plan"] == "fp32" else 2.0**-10  # one rounding of the sum (fp32 / fp16)
                assert s["err"] <= tol * s["scale"], f"rank {r} step {k} ({s['plan']}): {s['err']} vs {s['scale']}"
                assert s["stock_equal"], f"rank {r} step {k}: not stock Horovod's {s['plan']} allreduce, bit for bit"
                assert s["after"] == [], f"rank {r} step {k}: residuals kept after they were delivered: {s['after']}"
                nxt = steps[k + 1]
                if nxt["plan"] == "compressed":
                    assert nxt["held"] == [], "the next compressed step must start from zero"
                    assert any("#" not in h for h in nxt["after"]), "the next compressed step builds its residual"
            else:
                assert s["pattern"] == pattern
                assert s["after"], f"rank {r} step {k}: a compressed step left no residual"
        # each branch's steps as the script ran them: what the bytes are priced by
        rows = {p: n for p, _, _, n in rep[pattern]["branches"]}
        assert rows == {pattern: steps_of(steps, "compressed"), "fp32": steps_of(steps, "fp32"),
                        "fp16": steps_of(steps, "fp16")}, rows
    assert switched[0][pattern]["digest"] == switched[1][pattern]["digest"]


def steps_of(steps: list, plan: str) -> int:
    return sum(s["plan"] == plan for s in steps)
