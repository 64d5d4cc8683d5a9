"""Ordinary PyTorch training scripts work with hvd_gradq as with stock Horovod (issue 12).

Each check below failed on the code before this change: a hang (unused parameters, process
sets), an error (GradScaler overflow, sparse_as_dense, the rank-0 checkpoint recipe) or a silently
different result (scale factors). Two launches hold them all (``worker_torch_compat.py``).
"""
import pytest
from harness import assert_ranks_equal, launch

pytestmark = pytest.mark.parallel


@pytest.fixture(scope="module")
def cases() -> dict:
    return launch("worker_torch_compat.py", np=2, args=["--mode", "cases"], timeout=420)


def _ok(reps: dict, key: str) -> None:
    for r, rep in reps.items():
        assert not (isinstance(rep[key], str) and rep[key].startswith("FAILED")), f"rank {r} {key}:\n{rep[key]}"


UNUSED = [("qsgd:levels=4", "auto"), ("uniform:bits=4", "summable"), ("terngrad", "auto"),
          ("orq:levels=5,ef=true", "scatter"), ("qsgd:levels=4,ef=true", "scatter"), ("orq:levels=3", "gather")]


@pytest.mark.parametrize("spec,pattern", UNUSED)
def test_unused_and_rank_dependent_parameters_do_not_hang(cases: dict, spec: str, pattern: str) -> None:
    key = f"unused/{spec}/{pattern}"
    _ok(cases, key)
    assert_ranks_equal({r: {"d": rep[key]["digest"]} for r, rep in cases.items()}, "d")
    assert cases[0][key]["finite"]
    expected = {"auto": None, "summable": "summable", "scatter": "scatter", "gather": "gather"}[pattern]
    if expected:
        assert expected in cases[0][key]["patterns"], cases[0][key]["patterns"]
    if spec == "qsgd:levels=4" and pattern == "auto":
        assert "summable" in cases[0][key]["patterns"]  # the case that hung: summable's statistics


@pytest.mark.parametrize("spec", ["orq:levels=5,ef=true", "qsgd:levels=4,ef=true", "fp16", "topk:ratio=0.1,ef=true"])
def test_gradscaler_overflow_is_skipped_everywhere(cases: dict, spec: str) -> None:
    key = f"amp/{spec}"
    _ok(cases, key)
    for r, rep in cases.items():
        rec = rep[key]
        assert rec["skipped"][3], f"rank {r}: the overflow step (inf on rank 1) was not skipped"
        assert rec["scales"][3] == rec["scales"][2] / 2, rec["scales"]
        assert not all(rec["skipped"][4:]), "training did not resume after the overflow"
        assert rec["residuals_finite"]
        if "ef=true" in spec:
            assert rec["residual_kept"], f"rank {r}: the skipped step changed the error-feedback residuals"
    assert_ranks_equal({r: {"d": rep[key]["digest"]} for r, rep in cases.items()}, "d")


@pytest.mark.parametrize("spec", ["orq:levels=5,ef=true", "qsgd:levels=4,ef=true"])
def test_residuals_follow_loss_scale_changes_exactly(cases: dict, spec: str) -> None:
    key = f"amp-scale/{spec}"
    _ok(cases, key)
    rec = cases[0][key]
    assert rec["scales"][-1] > rec["scales"][0]  # the scale did change during the run
    assert rec["told"] == rec["plain"], "with loss_scale= the scaled run must equal the unscaled one bitwise"
    assert rec["untold"] != rec["plain"], "the check has no power: residuals in scaled units did not differ"


def test_sparse_as_dense_is_compressed(cases: dict) -> None:
    _ok(cases, "sparse_as_dense")
    for rep in cases.values():
        res = rep["sparse_as_dense"]
        for spec in ("none", "orq:levels=5,ef=true", "qsgd:levels=4"):
            assert res[spec]["compressed"] >= 3, (spec, res[spec])
        assert res["none"]["digest"] == res["stock"]["digest"], "lossless compression differs from stock Horovod"
    assert_ranks_equal({r: {"d": rep["sparse_as_dense"]} for r, rep in cases.items()}, "d")


def test_op_and_scale_factors_match_stock_horovod(cases: dict) -> None:
    _ok(cases, "scale_factors")
    for rep in cases.values():
        for k, err in rep["scale_factors"].items():
            assert err < 1e-6, f"case {k}: relative difference {err} from stock Horovod"


def test_adasum_and_other_ops_are_refused(cases: dict) -> None:
    _ok(cases, "adasum")
    for rep in cases.values():
        res = rep["adasum"]
        assert "Adasum" in res["optimizer"] and "hvd.Average" in res["optimizer"], res["optimizer"]
        assert "Adasum" in res["adasum"], res["adasum"]
        assert "Average and hvd.Sum only" in res["max"], res["max"]


def test_standard_checkpoint_recipe_resumes_exactly(cases: dict) -> None:
    _ok(cases, "checkpoint")
    for r, rep in cases.items():
        ck = rep["checkpoint"]
        assert ck["full"] == ck["resumed"], f"rank {r}: resumed from rank 0's file differs from the uninterrupted run"
        assert ck["residual_before"] > 0 and ck["steps_after_rank0_state"] > 0
        if r == 0:
            assert ck["residual_after_rank0_state"] == pytest.approx(ck["residual_before"])
        else:  # another rank's residuals are never adopted
            assert ck["residual_after_rank0_state"] == 0.0


def test_elastic_without_a_state_is_refused_at_the_first_step(cases: dict) -> None:
    msg = cases[0]["elastic"]
    assert "elastic" in msg and "TorchState" in msg, msg


def test_nonfinite_values_come_through_by_default(cases: dict) -> None:
    _ok(cases, "nonfinite")
    for rep in cases.values():
        for spec, res in rep["nonfinite"].items():
            assert res["any_nonfinite"], f"{spec}: an inf on rank 1 did not reach the reduced gradient"
            if not spec.startswith(("topk", "fp16")):  # bucketed: only the bucket holding the inf
                assert res["first_bucket_finite"], f"{spec}: a bucket without NaN/Inf was poisoned"


def test_process_sets_use_their_own_ranks() -> None:
    reps = launch("worker_torch_compat.py", np=3, args=["--mode", "sets"], timeout=300,
                  env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert reps[2]["sets"] == "idle"
    res0, res1 = reps[0]["sets"], reps[1]["sets"]
    for k in res0:
        if k == "mismatch":
            continue
        assert res0[k]["digest"] == res1[k]["digest"], k
        assert res0[k]["compressed"] > 0, k
        if k.startswith("none/"):  # lossless: exactly the average over the set (divisor 2)
            assert res0[k]["rel_err"] < 1e-6, (k, res0[k]["rel_err"])
    assert "process_set" in res0["mismatch"], res0["mismatch"]


def test_hierarchical_hosts_with_unused_parameters_and_a_process_set() -> None:
    """2 hosts x 2 ranks: rank-dependent and unused parameters with pattern=hierarchical (and auto,
    which takes it for large tensors here); a process set of one rank a host that asks for it
    gets the flat pattern its one-rank-a-host layout means, never a collective of the others."""
    reps = launch("worker_torch_compat.py", np=4, per_host=2, args=["--mode", "hosts"], timeout=400,
                  env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    for spec in ("orq:levels=5,ef=true", "qsgd:levels=4", "bingrad", "orq:levels=3"):
        key = f"unused/{spec}/{'auto' if spec == 'orq:levels=3' else 'hierarchical'}"
        _ok(reps, key)
        assert_ranks_equal({r: {"d": rep[key]["digest"]} for r, rep in reps.items()}, "d")
        assert reps[0][key]["finite"] and "hierarchical" in reps[0][key]["patterns"], reps[0][key]
    assert reps[1]["sets"] == reps[3]["sets"] == "idle"
    for spec, res in reps[0]["sets"].items():
        assert res["digest"] == reps[2]["sets"][spec]["digest"], spec
        assert "hierarchical" not in res["patterns"] and set(res["patterns"]) & {"gather", "scatter"}, res
        if spec == "none":  # lossless: exactly the average over the set
            assert res["rel_err"] < 1e-6, res


@pytest.mark.parametrize("spec,pattern", [("orq:levels=3,ef=true,warmup=2", "scatter"),
                                          ("bingrad:ef=true,warmup=2", "gather"), ("qsgd:levels=4,warmup=2", "summable")])
def test_warmup_steps_are_exact_then_compressed(cases: dict, spec: str, pattern: str) -> None:
    key = f"warmup/{spec}/{pattern}"
    _ok(cases, key)
    for r, rep in cases.items():
        rec = rep[key]
        # fp32 allreduce of the same gradients: equal up to the summation order of 2 floats
        assert max(rec["errs"][:2]) <= 1e-6, (r, rec["errs"])
        # 2-4 levels a bucket of 512: a quantized gradient is off by far more than 1e-3 somewhere
        assert min(rec["errs"][2:]) > 1e-3, (r, rec["errs"])
        assert rec["residuals"][:2] == [0, 0], "error feedback wrote residuals during warm-up"
        if "ef=true" in spec:
            assert rec["residuals"][2] > 0
    assert pattern in cases[0][key]["patterns"] and "fp32" in cases[0][key]["patterns"]
    assert_ranks_equal({r: {"d": rep[key]["digest"]} for r, rep in cases.items()}, "d")


SIM_CASES = [("orq:levels=5,ef=true", "scatter"), ("bingrad:ef=true,warmup=1", "gather"),
             ("qsgd:levels=4,ef=true", "summable"), ("uniform:bits=4", "auto"), ("orq:levels=3", "auto")]


@pytest.mark.parametrize("spec,pattern", SIM_CASES)
def test_quality_study_simulator_gives_the_frontends_bits(cases: dict, spec: str, pattern: str) -> None:
    """bench/quality/sim_reduce.py stands in for horovodrun in the quality study: fed the same local
    gradients, it must reproduce DistributedOptimizer's reduced gradients bit for bit (rank
    seeds, error feedback, every pattern, warm-up and the fp32 pass-through of the 3-float bias).
    Both run the reduction core (hvd_gradq/reduce/), so this checks the drivers (Horovod's
    asynchronous collectives and worker threads against the loopback), not the patterns' maths:
    the oracles of that are tests/unit/test_reduce_core.py and worker_torch_schemes.py."""
    key = f"sim/{spec}/{pattern}"
    _ok(cases, key)
    for r, rep in cases.items():
        assert rep[key]["compared"] == 12 and rep[key]["differ"] == [], (r, rep[key])
    if pattern != "auto":
        assert pattern in cases[0][key]["patterns"], cases[0][key]


# -- worker threads (hvd_gradq/frontend/workers.py): the same checks, encoding and decoding on two
# worker threads. The bits must not change: the digests equal the inline launch's, and the
# simulator (an oracle that runs no threads) still matches the frontend bit for bit.
THREADED = "unused/,sim/,nonfinite,warmup/"


@pytest.fixture(scope="module")
def threaded() -> dict:
    return launch("worker_torch_compat.py", np=2, args=["--mode", "cases", "--only", THREADED], timeout=420,
                  env={"HVD_GRADQ_THREADS": "2"})


@pytest.mark.parametrize("spec,pattern", UNUSED)
def test_worker_threads_give_the_inline_bits(cases: dict, threaded: dict, spec: str, pattern: str) -> None:
    key = f"unused/{spec}/{pattern}"
    _ok(threaded, key)
    for r in cases:
        assert threaded[r][key]["digest"] == cases[r][key]["digest"], f"rank {r} {key}: threads changed the bits"


def test_worker_threads_keep_the_simulator_bits_warmup_and_nonfinite(cases: dict, threaded: dict) -> None:
    for key in [k for k in threaded[0] if k.startswith(("sim/", "warmup/"))] + ["nonfinite"]:
        _ok(threaded, key)
        if key.startswith("sim/"):
            for r, rep in threaded.items():
                assert rep[key]["compared"] == 12 and rep[key]["differ"] == [], (r, key, rep[key])
        else:
            for r in cases:
                assert threaded[r][key] == cases[r][key], (r, key)
    assert sum(k.startswith("sim/") for k in threaded[0]) == len(SIM_CASES)


# -- codec=device (hvd_gradq/torch/device.py): every pattern encodes and decodes with the scheme's
# torch math on the tensor's device (CPU here: the path a CUDA tensor takes). Same bits as the host
# kernels: the cases cover gather, scatter (with EF) and summable.
@pytest.fixture(scope="module")
def on_device() -> dict:
    return launch("worker_torch_compat.py", np=2, args=["--mode", "cases", "--only", "unused/,sim/,nonfinite"],
                  timeout=420, env={"HVD_GRADQ_CODEC": "device"})


def test_device_codec_gives_the_host_bits(cases: dict, on_device: dict) -> None:
    keys = [k for k in on_device[0] if k.startswith(("unused/", "sim/"))] + ["nonfinite"]
    assert len(keys) == len(UNUSED) + len(SIM_CASES) + 1
    for key in keys:
        _ok(on_device, key)
        for r in cases:
            assert on_device[r][key] == cases[r][key], (r, key)
