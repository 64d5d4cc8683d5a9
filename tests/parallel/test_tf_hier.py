"""The hierarchical pattern (TensorFlow): 2 hosts x 2 ranks (cross-host gather) and 3 hosts x 2
ranks on a slow modelled link (cross-host scatter), against a NumPy simulation of every rank;
see worker_tf_hier.py."""
from __future__ import annotations

import pytest
from harness import assert_ranks_equal, launch


@pytest.mark.parametrize("np_,per_host,link,cross", [(4, 2, 10.0, "gather"), (6, 2, 0.01, "scatter")])
def test_hierarchical(np_: int, per_host: int, link: float, cross: str) -> None:
    reports = launch("worker_tf_hier.py", np=np_, per_host=per_host, args=["--link", str(link)], timeout=900,
                     env={"HVD_GRADQ_LINK_GBPS": str(link)})
    for r, rep in reports.items():
        assert rep["layout"] == [r, r % per_host, per_host, r // per_host, np_ // per_host]
        for sec in ("oracle", "auto"):
            assert "error" not in rep[sec], (r, sec, rep[sec])
        for spec, case in rep["oracle"].items():
            assert all(case["equal"]) and len(case["equal"]) == 9, (r, spec, case["equal"])
            assert case["cross"]["c"] == cross, (spec, case["cross"])  # the largest: as the set-up means
            assert case["patterns"] == ["hierarchical"], (spec, case)
            assert case["bytes_ok"], (r, spec)
            if "ef=true" in spec:
                assert case["residuals_equal"] and all(case["residuals_equal"]), (r, spec, case["residuals_equal"])
        nf = rep["nonfinite"]
        assert "nonfinite=raise with pattern=hierarchical" in nf["refused"], nf
        assert nf["raised"] == "raised:True" and nf["patterns"] == ["gather"], (r, nf)
        ps = rep["psets"]
        assert ps == {"member": False} if r not in (0, 2) else (ps["exact"] and ps["patterns"] in (["gather"], ["scatter"])), (r, ps)
        assert rep["auto"]["want"] == "hierarchical" and rep["auto"]["got"] == ["hierarchical"], rep["auto"]
    for spec in reports[0]["oracle"]:
        assert_ranks_equal({r: {"d": rep["oracle"][spec]["digest"]} for r, rep in reports.items()}, "d")
    assert_ranks_equal({r: {"d": rep["auto"]["digest"]} for r, rep in reports.items()}, "d")
    # the CPU figures: ranks that measured apart (alone they would decide differently) agree on the
    # maximum and decide alike. fallback=True no longer applies the model's fp16 fallback: auto
    # measures its plans on the tape's steps (plan/trial.py; tests/parallel/test_tf_trial.py), and a
    # job's first step runs the compressed plan, so both compress as the model decides
    fb = {r: rep["fallback"] for r, rep in reports.items()}
    assert "error" not in fb[0] and len({f["alone"] for f in fb.values()}) > 1 and fb[0]["alone"] != "fp16", fb
    for r, f in fb.items():
        assert f["True"]["patterns"] == f["False"]["patterns"] == fb[0]["True"]["patterns"], (r, f)
        assert f["True"]["patterns"][0] not in ("fp16", "fp32"), (r, f)
        assert f["True"]["figures"] == fb[0]["True"]["figures"], (r, f)
    assert max(e for _, e, _ in fb[0]["True"]["figures"]) == 400.0 + np_ - 1, fb[0]
    assert_ranks_equal({r: {"d": f["digestTrue"]} for r, f in fb.items()}, "d")
