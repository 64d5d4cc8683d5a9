"""The hierarchical pattern (PyTorch): 2 hosts x 2 ranks (the cross-host part gathers) and
3 hosts x 2 ranks on a slow modelled link (the cross-host part scatters), against a NumPy oracle
of the pattern; last, a rank killed as a step's last round goes out (every survivor raises, none
aborts); see worker_torch_hier.py."""
from __future__ import annotations

import re

import pytest
from harness import assert_ranks_equal, launch


@pytest.mark.parametrize("np_,per_host,link,cross", [(4, 2, 10.0, "gather"), (6, 2, 0.01, "scatter")])
def test_hierarchical(np_: int, per_host: int, link: float, cross: str) -> None:
    reports = launch("worker_torch_hier.py", np=np_, per_host=per_host, args=["--link", str(link)], timeout=600,
                     env={"HVD_GRADQ_LINK_GBPS": str(link)})
    for r, rep in reports.items():
        failed = {k: v for k, v in rep.items() if isinstance(v, str) and v.startswith("FAILED")}
        assert not failed, f"rank {r}: {failed}"
        assert rep["layout"] == [r, r % per_host, per_host, r // per_host, np_ // per_host]
    for key in [k for k in reports[0] if k.startswith("oracle|")]:
        for r, rep in reports.items():
            case = rep[key]
            assert case["bad"] == [], f"rank {r} {key}: steps {case['bad']} differ from the oracle"
            # the tensor took the hierarchical pattern, its choice carrying the cross part the oracle takes
            assert case["ctx"] == [f"hierarchical/{case['cross']}/{case['cross']}"], (key, case)
            assert case["sent"] == case["exact_sent"] > 0, (r, key, case)
            assert abs(case["model_sent"] - case["sent"]) <= (case["slack"] if cross == "scatter" else 0), (r, key, case)
        assert_ranks_equal({r: {"d": rep[key]["digests"]} for r, rep in reports.items()}, "d")
    assert {rep["oracle|orq:levels=5|big|Average"]["cross"] for rep in reports.values()} == {cross}
    # the CPU figures: ranks that measured apart (alone they would decide differently) agree on the
    # maximum and decide alike. In PyTorch fallback=True no longer applies the model's fp16 fallback:
    # auto measures its plans on DistributedOptimizer's steps (plan/trial.py; tests/parallel/
    # test_torch_trial.py), so a direct reduction keeps the model's pattern either way
    fb = {r: rep["fallback"] for r, rep in reports.items()}
    assert len({f["alone"] for f in fb.values()}) > 1 and fb[0]["alone"] != "fp16", fb
    for r, f in fb.items():
        assert f["True"]["pattern"] == f["False"]["pattern"] == fb[0]["True"]["pattern"], (r, f)
        assert f["True"]["pattern"] not in ("fp16", "fp32"), (r, f)
        assert f["True"]["figures"] == fb[0]["True"]["figures"], (r, f)
    top = {k: (e, d) for k, e, d in fb[0]["True"]["figures"]}
    assert max(e for e, _ in top.values()) == 400.0 + np_ - 1, top  # the slowest rank's encode: the maximum
    assert_ranks_equal({r: {"d": rep["auto"]["digest"]} for r, rep in reports.items()}, "d")
    auto = reports[0]["auto"]
    assert auto["want"] == "hierarchical" and "hierarchical" in auto["patterns"], auto
    # issue 35, item 10 (the launch's last case): the last rank died as the step's last round of
    # collectives went out (every tensor's last phase, 1-element tensors among them); every
    # survivor raised Horovod's error within Gloo's timeout and lived to report it (an abort, as a
    # stray part landing in a smaller buffer caused, or a hang, leaves no report: the launch fails)
    died = reports[np_ - 1]["killed"]["victim"]
    assert len(died) == 6 and re.fullmatch(r"hvd_gradq\.h[34]\.k\.scale", died[4]), died  # name order: the 5th
    for r in range(np_ - 1):
        got = reports[r]["killed"]
        assert got["survivor"] and got["type"] == "HorovodInternalError", (r, got)
        assert got["s"] < 170, (r, got)  # within Gloo's timeout (180 s in the harness): not a hang
    for r, rep in reports.items():
        assert rep["nonfinite"] == f"raised:{np_}:True", (r, rep["nonfinite"])
        # a value beyond the scheme's range on the last rank: every rank stops naming it
        got = rep["range"]
        assert got["type"] == "RangeError" and got["after"] == np_, (r, got)
        if r == np_ - 1:
            assert re.match(r"t\.range \(step 0\): a finite value of magnitude 2e\+38", got["message"]), (r, got)
        else:
            assert re.match(rf"t\.range( \(step 0\))?: rank(\(s\) \[{np_ - 1}\]| {np_ - 1}) had a finite value",
                            got["message"]), (r, got)
