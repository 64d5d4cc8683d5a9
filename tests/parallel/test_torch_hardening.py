"""Hardening of the PyTorch frontend under horovodrun (issue: hardening)."""
import re
import time

import pytest
from harness import LaunchError, launch

pytestmark = pytest.mark.parallel


def test_checkpoint_resume_is_bitwise() -> None:
    reps = launch("worker_torch_hardening.py", np=2, args=["--mode", "resume"], timeout=400)
    for r, rep in reps.items():
        for spec, d in rep.items():
            if isinstance(d, dict):
                assert d["full"] == d["resumed"], f"rank {r} {spec}: resumed run differs from the uninterrupted one"
        assert "ranks" in rep["other_size"] and "resume on the same number of ranks" in rep["other_size"]
    assert reps[0]["orq:levels=5,ef=true"] == reps[1]["orq:levels=5,ef=true"]


@pytest.mark.parametrize("spec", ["orq:levels=5,nonfinite=raise", "qsgd:levels=4,nonfinite=raise"])  # gather, summable
def test_nonfinite_on_one_rank_stops_every_rank(spec: str) -> None:
    reps = launch("worker_torch_hardening.py", np=2, args=["--mode", "nonfinite"], env={"SPEC": spec}, timeout=200)
    assert "non-finite" in reps[1]["error"] and "(step 2)" in reps[1]["error"], reps[1]["error"]
    # rank 0 stops too, with hvd_gradq's error (naming rank 1) or, if rank 1 ended first,
    # Horovod's shutdown error; it never hangs and never trains on.
    e0 = reps[0]["error"]
    assert ("non-finite" in e0 and "rank" in e0) or "Horovod has been shut down" in e0, e0


def test_ranks_that_disagree_are_named() -> None:
    reps = launch("worker_torch_hardening.py", np=2, args=["--mode", "disagree"], timeout=200)
    for rep in reps.values():
        msg = rep["error"]
        assert "ranks disagree" in msg and "ranks [1]" in msg and "levels=3" in msg and "levels=5" in msg, msg


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_dying_worker_ends_the_job(controller: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch("worker_torch_hardening.py", np=2, controller=controller, args=["--mode", "die"], timeout=120)
    took = time.monotonic() - t0
    msg = str(info.value)
    assert "exited with" in msg and "hang" not in msg
    # the launchers name the rank that died: gloo "Process name: 1", Open MPI "Process name: [[job,1],1]"
    assert re.search(r"Process name: (1|\[\[\d+,\d+\],1\])\s+Exit code:\s+3", msg), msg
    assert took < 90, took


@pytest.mark.timeout(1800)
def test_long_run_memory_is_flat() -> None:
    # 2,000 steps of 300 compressed tensors: 0.1-0.4 s a step on 2 shared cores (per-tensor
    # Python and Horovod negotiation), so this is the suite's longest test
    reps = launch("worker_torch_hardening.py", np=2, args=["--mode", "long", "--steps", "2000"], timeout=1700)
    for r, rep in reps.items():
        assert rep["tensors"] >= 300 and rep["steps"] == 2000
        rss = rep["rss"]  # every 50 steps
        warm = rss[5]  # after 300 steps: allocator pools, Horovod's response cache, numba's first calls
        growth = (max(rss[6:]) - warm) / warm
        assert growth < 0.02, f"rank {r}: resident memory grew {growth:.1%} after warm-up: {rss}"
        assert rep["ef_elements"] == rep["params"] and rep["ef_fp32"]
        assert rep["ef_bytes"] == 4 * rep["params"]
        assert rep["pending"] == 0
