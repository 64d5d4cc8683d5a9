"""What every frontend's real trial must show (tests/parallel/test_torch_trial.py, test_tf_trial.py):
one shared list of checks on the two ranks' reports, so the frontends cannot drift apart."""
from __future__ import annotations


def check_trial(a: dict, b: dict) -> dict:
    """Rank 0's report ``a`` and rank 1's ``b`` of a trained job with auto measuring; returns
    ``stats()['auto']`` for the frontend's own checks."""
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
    check_link(a["link"], b["link"])
    return auto


def check_link(a: dict, b: dict) -> None:
    """Each rank's report of a compressor that measured the link at its handshake
    (:mod:`measuring_link`): the same rate on every rank, bit for bit (every decision reads
    it), a real measurement and not the default."""
    assert a["link"].startswith("measured: ") and b["link"].startswith("measured: "), (a, b)
    assert a["gbps"] == b["gbps"], f"the ranks price with different link rates: {a['gbps']!r} vs {b['gbps']!r}"
    assert 1e-3 < a["gbps"] < 400.0, a  # neither clamp: a 1 MiB allgather on loopback is timed
