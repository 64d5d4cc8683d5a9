"""The platform's parallel smoke tests: stock Horovod, both frameworks, Gloo and MPI, 2 ranks;
and the harness itself catching a disagreeing rank and a hang."""
import time

import pytest
from harness import HangError, LaunchError, assert_ranks_equal, launch

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_stock_training_identical_on_ranks(framework: str, controller: str) -> None:
    reports = launch(f"worker_smoke_{framework}.py", np=2, controller=controller, timeout=240)
    assert sorted(reports) == [0, 1]
    assert all(r["size"] == 2 for r in reports.values())
    assert_ranks_equal(reports, "digest")


def test_harness_reports_a_perturbed_rank() -> None:
    reports = launch("worker_smoke_torch.py", np=2, args=["--perturb-rank", "1"], timeout=240)
    with pytest.raises(LaunchError, match=r"ranks \[1\] differ from rank 0"):
        assert_ranks_equal(reports, "digest")


def test_harness_reports_a_hang() -> None:
    t0 = time.monotonic()
    with pytest.raises(HangError, match="did not finish in 8 s"):
        launch("worker_smoke_torch.py", np=2, args=["--hang-rank", "1"], timeout=8)
    assert time.monotonic() - t0 < 40
