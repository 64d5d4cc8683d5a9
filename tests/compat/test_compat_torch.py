"""Horovod 0.28.1's own optimizer-level PyTorch tests pass with every hvd_gradq scheme (2 ranks).

One launch runs every (scheme, test) pair (``worker_torch.py``, about 2 minutes on 2 cores);
the summary lines printed here are the pass counts per scheme that the README quotes.
"""
import pytest
from harness import launch

pytestmark = pytest.mark.parallel

SCHEMES = ("none fp16 uniform:bits=8 qsgd:levels=4 terngrad sign:ef=true topk:ratio=0.05,ef=true bingrad:ef=true "
           "orq:levels=3 orq:levels=5,ef=true")
# tests that build no DistributedOptimizer on a rank when they pass (they check its refusal)
NO_OPTIMIZER = ("test_duplicate_names", "test_missing_named_parameters")


def test_horovod_optimizer_tests_pass_with_every_scheme(schemes: str = SCHEMES) -> None:
    # as a user runs them: auto measuring its plans (the default; the harness turns it off elsewhere)
    reps = launch("../compat/worker_torch.py", np=2, timeout=850,
                  env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1", "COMPAT_SCHEMES": schemes, "HVD_GRADQ_FALLBACK": "1"})
    failed = []
    for rank, rep in sorted(reps.items()):
        assert sorted(k for k in rep if not k.startswith("_")) == sorted(schemes.split())
        for spec, results in rep.items():
            if not isinstance(results, dict):
                continue
            tests = {t: r for t, r in results.items() if "#" not in t}
            passed = sum(r == "ok" for r in tests.values())
            if rank == 0:
                print(f"compat torch {spec}: {passed}/{len(tests)} passed")
            for t, r in tests.items():
                if r != "ok":
                    failed.append(f"rank {rank} {spec} {t}: {r}")
                elif results[t + "#compressors"] == 0 and t not in NO_OPTIMIZER:
                    failed.append(f"rank {rank} {spec} {t}: ran without an hvd_gradq compressor")
    assert not failed, "\n".join(failed)
