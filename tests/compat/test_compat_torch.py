"""Horovod 0.28.1's own optimizer-level PyTorch tests pass with every hvd_gradq scheme (2 ranks).

One launch runs every (scheme, test) pair (``worker_torch.py``); the summary line printed here is
the pass count per scheme that the README quotes.
"""
import pytest
from harness import launch

pytestmark = pytest.mark.parallel


def test_horovod_optimizer_tests_pass_with_every_scheme() -> None:
    reps = launch("../compat/worker_torch.py", np=2, timeout=900, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    failed = []
    for rank, rep in sorted(reps.items()):
        for spec, results in rep.items():
            if not isinstance(results, dict):
                continue
            tests = {t: r for t, r in results.items() if not t.endswith("#compressors")}
            passed = sum(r == "ok" for r in tests.values())
            if rank == 0:
                print(f"compat torch {spec}: {passed}/{len(tests)} passed")
            for t, r in tests.items():
                if r != "ok":
                    failed.append(f"rank {rank} {spec} {t}: {r}")
                # the substitution happened (a test that builds no optimizer on this rank is exempt)
                elif results[t + "#compressors"] == 0 and t not in ("test_duplicate_names", "test_missing_named_parameters"):
                    failed.append(f"rank {rank} {spec} {t}: ran without an hvd_gradq compressor")
    assert not failed, "\n".join(failed)
