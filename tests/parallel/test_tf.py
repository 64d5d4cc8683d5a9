"""hvd_gradq.tensorflow under horovodrun: every scheme trained with Keras ``model.fit``, the
GradientTape features (checkpoint/resume, dtypes, eager, sparse, Sum/Average, the NumPy oracle,
a rank mismatch), on 2 ranks with Gloo and MPI and on 4 ranks.

Each launch pays ~10 s of TensorFlow imports per rank, so every worker loops over its cases
inside one launch. Loss tolerances: ``model.evaluate`` on the whole generated data set after 2
epochs, minus the same run's with ``hvd.Compression.none`` (0.43-0.46; untrained: ln 4 = 1.39), per
scheme in ``TOL`` (see there for the measurements behind each bound).
"""
import math
import re
import time

import pytest
from harness import HangError, LaunchError, assert_ranks_equal, launch

pytestmark = pytest.mark.parallel

# |loss - uncompressed loss| after 2 epochs, per run label without "/bpps2". Measured with the
# worker's --seed 0..2 (the data, the init and the rounding noise; 0 is the suite's run), the
# worst of them in brackets:
#   fp16, uniform, qsgd, orq, each with or without EF, and qsgd+ef/bpps2: [0.0034]
#   terngrad (clipped at 2.5 sigma: biased), with or without EF: [0.028]
#   sign, topk, bingrad with EF: [0.024]
#   sign, topk, bingrad without EF: slower by design, +0.19 to +0.23 [0.234]
# The unbiased schemes get 0.02 (6x their worst), terngrad and the EF'd biased ones 0.05 (1.8x,
# as before), the biased ones 0.3 (1.3x: their ~0.2 is systematic, not noise). A scheme that sends zeros
# stays near the untrained loss, about +0.9 (ln 4 - 0.45), beyond every bound here.
TOL_UNBIASED = 0.02
TOL = {"terngrad": 0.05, "sign+ef": 0.05, "topk+ef": 0.05, "bingrad+ef": 0.05, "terngrad+ef": 0.05,
       "sign": 0.3, "topk": 0.3, "bingrad": 0.3}
SCHEMES = ["fp16", "uniform", "qsgd", "terngrad", "sign", "topk", "bingrad", "orq"]
MPI_RUNS = ["none", "qsgd+ef", "terngrad", "orq+ef", "topk+ef", "sign"]
# Open MPI busy-polls by default; on a machine with fewer cores than ranks plus TF's threads that
# starves the ranks: let idle MPI processes yield.
MPI_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def _check_fit(reports, labels):
    runs0 = reports[0]["runs"]
    assert sorted(runs0) == sorted(labels)
    for label in labels:
        for key in ("digest", "loss"):  # weights bitwise equal; so is the loss on the same data
            ref = runs0[label][key]
            bad = [r for r in reports if reports[r]["runs"][label][key] != ref]
            assert not bad, f"{label}: ranks {bad} differ from rank 0 in {key}"
    for label in labels:
        if label.startswith("none"):
            continue
        rec = runs0[label]
        base = runs0["none/bpps2" if label.endswith("bpps2") else "none"]["loss"]
        tol = TOL.get(label.split("/")[0], TOL_UNBIASED)
        assert math.isfinite(rec["loss"]) and abs(rec["loss"] - base) <= tol, (label, rec["loss"], base, tol)
        assert rec["ratio"] > 1.0, (label, rec)  # fewer bytes than fp32 allreduce, even for tiny tensors
        want = 32 if not label.endswith("bpps2") else 16  # 16 batches x 2 epochs, or every 2nd
        assert rec["steps"] == [want] * 4, (label, rec["steps"])
    pats = {p for lab in labels if "patterns" in runs0[lab] for p in runs0[lab]["patterns"]}
    # the 4-element bias goes uncompressed ("fp32": its payload header alone outweighs it)
    assert pats == {"gather", "summable", "fp32"}, pats


def test_fit_every_scheme_gloo():
    labels = ["none", "none/bpps2", "qsgd+ef/bpps2"] + [s + e for s in SCHEMES for e in ("", "+ef")]
    reports = launch("worker_tf_fit.py", np=2, controller="gloo", timeout=600)
    _check_fit(reports, labels)


def test_fit_schemes_mpi():
    reports = launch("worker_tf_fit.py", np=2, controller="mpi", args=["--runs", ",".join(MPI_RUNS)], timeout=400,
                     env=MPI_ENV)
    _check_fit(reports, MPI_RUNS)


def _check_tape(reports, sections):
    r0 = reports[0]
    if "ckpt" in sections:
        for spec, rec in r0["ckpt"].items():
            assert rec["resumed"] == rec["straight"], f"{spec}: resumed after a checkpoint != uninterrupted"
            assert rec["residuals_exact"] and rec["residuals_nonzero"] and rec["residual_end_same"], (spec, rec)
            assert rec["steps_at5"] == [50] * rec["slots"] and rec["steps_end"] == [100] * rec["slots"], (spec, rec)
        assert_ranks_equal(reports, "ckpt")
    if "oracle" in sections:
        for spec, rec in r0["oracle"].items():
            if isinstance(rec, dict):
                assert rec["oracle_equal"], f"{spec}: the decoded sum differs from the NumPy oracle's"
        assert r0["oracle"]["none"]["sum_exact"] and r0["oracle"]["none"]["avg_exact"]  # rank-order fp32 sum
        assert r0["oracle"]["eager_none_close"] and r0["oracle"]["eager_qsgd_within_step"]
        assert r0["oracle"]["eager_ef_refused"]
        assert_ranks_equal(reports, "oracle")
    if "fed" in sections:  # one pass in the encode: the bits of the unfused graph ops, and fused indeed
        for spec, rec in r0["fed"].items():
            assert rec["fed"]["digest"] == rec["unfed"]["digest"], (spec, rec)
            assert rec["fed"]["residuals"] == rec["unfed"]["residuals"] and rec["fed"]["nonzero"], (spec, rec)
            assert rec["fed"]["traced"] >= 2 and rec["unfed"]["traced"] == 0, (spec, rec)
            assert all(reports[r]["fed"][spec]["fed"]["digest"] == rec["fed"]["digest"] for r in reports), spec
    if "dtypes" in sections:
        for dtype, rec in r0["dtypes"].items():
            assert rec["finite"] and rec["var_dtypes"] == [dtype] == rec["slot_dtypes"], (dtype, rec)
            assert rec["steps"] == [3] * 4, (dtype, rec)
        assert_ranks_equal(reports, "dtypes")
    if "eager" in sections:
        assert r0["eager"]["steps"] == [3] * 4
        assert_ranks_equal(reports, "eager")
    if "sparse" in sections:
        # the embedding's IndexedSlices bypass the compressor unless sparse_as_dense
        assert r0["sparse"]["sparse"]["slot_shapes"] == [[8, 2], [2]]
        assert r0["sparse"]["dense"]["slot_shapes"] == [[50, 8], [8, 2], [2]]
        assert_ranks_equal(reports, "sparse")
    if "nonfinite" in sections:
        # rank 1 (the NaN) fails first with hvd_gradq's message; after that, a collective of another
        # tensor that one rank started before its step aborted may stall until Horovod's stall
        # shutdown (the launch sets it: see the TF compressor's docstring) ends it
        for r, rep in reports.items():
            for spec, msg in rep["nonfinite"].items():
                assert "non-finite" in msg or "Horovod has been shut down" in msg, (r, spec, msg)
        first = next(iter(reports[1]["nonfinite"].values()))
        assert "non-finite" in first, reports[1]["nonfinite"]
        # fp16:overflow=raise on rank 1 (gather): it sent a marked row, so decoding stops every rank
        # (it runs before the NaN cases, so no stall shutdown can have come first)
        refused = "rank(s) [1] had a finite value in this gradient that the scheme cannot quantize"
        assert refused in reports[1]["fp16_overflow"], reports[1]["fp16_overflow"]
        assert refused in reports[0]["fp16_overflow"] or "Horovod has been shut down" in reports[0]["fp16_overflow"]
    if "telemetry" in sections:
        _check_telemetry(reports)
    if "mismatch" in sections:
        for r in reports.values():
            assert "ranks disagree on the hvd_gradq configuration" in r["mismatch"], r["mismatch"]
            assert "levels=5" in r["mismatch"] and "levels=9" in r["mismatch"]
            assert r["check_ranks"] == "ran", r["check_ranks"]


def _check_telemetry(reports):
    """stats() and metrics() after 3 steps of a 2-rank tape (orq, gather and fp32 slots), on every
    rank; the first-step log line on rank 0 only (the default handler)."""
    size = len(reports)
    for r, rep in reports.items():
        st, t = rep["telemetry"]["stats"], rep["telemetry"]
        assert {k: [v["pattern"], v["why"]] for k, v in st["tensors"].items()} == t["decided"], (r, st["tensors"])
        assert st["tensors"] == reports[0]["telemetry"]["stats"]["tensors"], f"rank {r}: tensors differ from rank 0's"
        assert {v["pattern"] for v in st["tensors"].values()} == {"gather", "fp32"}, st["tensors"]
        assert all(" at 1 Gbit/s" in v["why"] for v in st["tensors"].values() if v["pattern"] == "gather")
        for v in st["tensors"].values():  # Horovod's ring allreduce a rank: 2(N-1)/N x bytes
            assert v["fp32"] == round(2 * (size - 1) * 4 * v["elements"] / size) == 2 * v["fp16"], v
        last, total = st["last_step"]["all"], st["total"]["all"]
        assert st["steps"] == 3 and total["sent"] == 3 * last["sent"] and total["fp32"] == 3 * last["fp32"], st
        assert last["fp32"] == 2 * last["fp16"] and last["vs_fp32_allreduce"] == last["fp32"] / last["sent"] > 2
        # PyTorch's kinds: host encode/decode, the wait between them, their sum as the compressor's
        assert set(st["time"]["last_step"]) == {"encode_s", "wait_s", "decode_s", "compressor_s"}, st["time"]
        assert all(v > 0 for w in ("last_step", "total") for v in st["time"][w].values()), st["time"]
        tl = st["time"]["total"]
        assert tl["compressor_s"] == pytest.approx(tl["encode_s"] + tl["decode_s"]), tl
        m = t["metrics"]
        assert all(k.startswith("hvd_gradq/") and type(v) in (int, float) for k, v in m.items()), m
        assert (m["hvd_gradq/step"], m["hvd_gradq/bytes_sent"]) == (3, last["sent"]) and m["hvd_gradq/decode_ms"] > 0
    where = "2 ranks on 1 host; cost model: 1 Gbit/s, 1 rank a host"  # horovodrun -H localhost:2
    err = reports[0]["telemetry"]["stderr"]
    assert f"hvd_gradq INFO: first step: orq (pattern=auto), {where}; 4 tensors: " in err, err
    assert f"hvd_gradq INFO: step 2: orq (pattern=auto), {where}; " in err, err  # log_every=2, from the spec's line
    assert "hvd_gradq" not in reports[1]["telemetry"]["stderr"], reports[1]["telemetry"]["stderr"]
    text = reports[0]["telemetry"]["summary"]
    assert text.startswith(f"hvd_gradq: orq (pattern=auto), {where}; 3 steps"), text
    assert "  gather " in text and "in its host functions" in text, text


def test_tape_features_gloo():
    # the nonfinite section is the last: a stall it may leave (see _check_tape) ends by Horovod's
    # stall shutdown, after 120 s, well within the launch's timeout
    reports = launch("worker_tf_tape.py", np=2, controller="gloo", timeout=420,
                     env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120"})
    _check_tape(reports, {"ckpt", "oracle", "telemetry", "dtypes", "eager", "sparse", "mismatch", "fed", "nonfinite"})


def test_tape_features_mpi():
    reports = launch("worker_tf_tape.py", np=2, controller="mpi", timeout=400, env=MPI_ENV,
                     args=["--only", "ckpt,oracle", "--ckpt-specs", "qsgd:ef=true"])
    _check_tape(reports, {"ckpt", "oracle"})


def test_tape_four_ranks():
    """4 payloads decoded and summed in rank order, against the NumPy oracle, Sum and Average.

    (Checkpoint/resume is checked at 2 ranks. Beyond 2 ranks, tiny tensors that pattern=auto
    hands to Horovod's own fp32 allreduce are summed in an order that depends on Horovod's
    tensor fusion, so a resumed run matches an uninterrupted one bit for bit only with
    HOROVOD_FUSION_THRESHOLD=0 or pattern=gather; ranks agree either way.)"""
    reports = launch("worker_tf_tape.py", np=4, controller="gloo", timeout=400, args=["--only", "oracle"])
    assert sorted(reports) == [0, 1, 2, 3]
    _check_tape(reports, {"oracle"})


def test_tape_dying_worker_ends_the_job():
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch("worker_tf_tape.py", np=2, controller="gloo", timeout=120, args=["--only", "die"])
    msg = str(info.value)
    assert "exited with" in msg and re.search(r"Process name: 1\s+Exit code:\s+3", msg), msg[-3000:]
    assert time.monotonic() - t0 < 90


def test_tape_rank_that_never_reaches_the_handshake_ends_the_job():
    """Issue 35, item 8, through TensorFlow's handshake (an eager allgather on a thread): rank 1
    never takes its first step; rank 0 raises within HVD_GRADQ_HANDSHAKE_TIMEOUT and the job ends."""
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch("worker_tf_tape.py", np=2, controller="gloo", timeout=120, args=["--only", "stall"],
               env={"HVD_GRADQ_HANDSHAKE_TIMEOUT": "3"})
    msg = str(info.value)
    assert "exited with" in msg and not isinstance(info.value, HangError), msg[-3000:]
    assert "hvd_gradq.tensorflow: no handshake from the other ranks within 3 s. This rank waits in collective " \
           "hvd_gradq.tfconfig" in msg, msg[-3000:]
    assert time.monotonic() - t0 < 90


def _no_errors(reports, sections):
    for r, rep in reports.items():
        for s in sections:
            assert s in rep, (r, s, sorted(rep))
            assert not (isinstance(rep[s], dict) and "error" in rep[s]), (r, s, rep[s].get("error"), rep[s].get("trace"))


def test_horovod_features_gloo():
    """Issue 12, wherever stock Horovod trains: Adasum refused, scale factors, process sets, state
    keyed by variable, sparse_as_dense, propagate for every scheme, loss scaling, checkpoints
    restored on another rank, elastic mode's eager reduction, a rank retracing alone
    (worker_tf_compat.py, two launches)."""
    sections = ["adasum", "scale", "psets", "keys", "dynamic", "propagate", "lossscale", "ckptrank", "elastic",
                "warmup", "ragged"]
    # 600 s: TensorFlow's verdict round a tensor (one more collective a tensor and step) took this
    # launch from 217 s to 302 s at load 15 on 2 cores, and past 420 s at load 25
    reports = launch("worker_tf_compat.py", np=2, controller="gloo", timeout=600,
                     args=["--only", "adasum,scale,psets,keys,dynamic,elastic,warmup"])
    more = launch("worker_tf_compat.py", np=2, controller="gloo", timeout=600,
                  args=["--only", "propagate,lossscale,ckptrank,ragged"])
    for r in reports:
        reports[r].update({k: v for k, v in more[r].items() if k in sections})
    _no_errors(reports, sections)
    for r, rep in reports.items():
        # 1. Adasum: a clear error on every rank (Horovod's Keras optimizer refuses it itself), no hang
        ad = rep["adasum"]
        for k in ("tape", "allreduce"):
            assert "Adasum cannot be combined with a hvd_gradq compressor" in ad[k], (r, k, ad[k])
        assert "Adasum" in ad["keras"] or "only supports Average and Sum" in ad["keras"], ad["keras"]
        assert ad["after"] == 2.0
        # 2. scale factors: stock Horovod's result (fp32 pass-through payloads: rounding only)
        for case, rec in rep["scale"].items():
            if isinstance(rec, dict):
                assert rec["eager_rel"] <= 1e-6 and rec["graph_rel"] <= 1e-6, (case, rec)
        assert rep["scale"]["predivide_rel"] <= 1e-6
        # 3. process sets
        ps = rep["psets"]
        assert ps["both_rel"] <= 1e-6 and ps["orq_rel"] < 1.0 and ps["own_set_finite"], ps
        assert "process_set" in ps["mismatch"] and "pass the same process set" in ps["mismatch"], ps["mismatch"]
        if r == 0:
            assert ps["single_ok"] and ps["single_eager"] > 0.0  # a set of one: its own (quantized) tensor
        # 4. variable keys: frozen layers keep their state, new slots after unfreezing, checkpoint by name
        k = rep["keys"]
        names = k["names"]
        assert "dense/kernel:0" not in k["frozen"] and set(k["unfrozen"]) == set(names), k
        assert k["refrozen"]["dense/kernel:0"] == k["unfrozen"]["dense/kernel:0"], k
        assert k["refrozen"]["dense_1/kernel:0"] > k["unfrozen"]["dense_1/kernel:0"], k
        assert k["frozen_residual_kept"] and k["others_moved"], k
        assert k["restored_keys"] == sorted(names)
        assert all(k["restored_steps"][n] == k["refrozen"][n] + 1 for n in names), k
        # 5. sparse_as_dense: the embedding's gradient compressed at the variable's static shape
        d = rep["dynamic"]
        assert [50, 64] in d["keras_slots"] and all(math.isfinite(v) for v in d["keras_loss"]), d
        assert d["unknown_shape_sum"] == [3.0, 3.0]  # no static shape, no variable: Horovod's own sum
        # 6. propagate: NaN where a rank had Inf, residuals kept there, recovery next step
        for case, rec in rep["propagate"].items():
            assert rec["bad_at_700"] and rec["residual_finite"] and rec["recovered"], (case, rec)
            assert rec["residual_kept_where_nonfinite"], (case, rec)
            lossless = case.startswith("none")
            assert lossless or rec["residual_moved_elsewhere"], (case, rec)
            if case.startswith(("none", "fp16")):  # the values carry it: that element only
                assert rec["bad_count"] == 1, (case, rec)
            elif case.startswith("topk"):  # no per-bucket scale: the whole tensor
                assert rec["bad_count"] == 1200, (case, rec)
            else:  # level schemes: that bucket only
                assert rec["bad_count"] == 512 and rec["first_bucket_finite"], (case, rec)
        assert len(rep["propagate"]) == 13
        # 7. loss scaling: residuals stored unscaled (two fixed scales agree bit for bit); an overflow
        # on one rank is skipped on every rank, residuals survive it, the scale halves
        ls = rep["lossscale"]
        assert ls["s10"]["residuals"] == ls["s4"]["residuals"] and ls["s10"]["weights"] == ls["s4"]["weights"], ls
        assert ls["dyn"]["skipped"] and ls["dyn"]["residuals_kept"] and ls["dyn"]["scale_after"] == 512.0, ls
        assert ls["dyn"]["finite"] and ls["s10"]["finite"], ls
        # 8. checkpoints: a rank's own file resumes exactly; another rank's residuals are not used
        ck = rep["ckptrank"]
        assert ck["own_next"] == ck["straight_next"], ck
        assert ck["own_steps"] == ck["rank0_steps"] == [3] * len(ck["own_steps"]), ck
        assert ck["rank0_owners"] == [0] and ck["rank0_owners_after"] == [r], ck
        assert ck["rank0_next"] == ck["oracle_next"], ck
        # rank 0 restores, compression.broadcast_state: rank 0's counters everywhere, its residuals on rank 0
        # only (the others read zero): the same as every rank restoring rank 0's file
        assert ck["bcast_steps"] == ck["rank0_steps"] and ck["bcast_owners"] == [0], ck
        assert ck["bcast_next"] == ck["rank0_next"] and ck["bcast_owners_after"] == [r], ck
        assert "no state to broadcast yet" in ck["bcast_early"] and "get_concrete_function" in ck["bcast_early"], ck
        # rank 0 restores, broadcast_state forgotten: hvd_gradq's error on every rank, not a hang or
        # Horovod's; every later step raises it too; no counter moved; collectives still run
        for key in ("forgot", "forgot_again"):
            msg = ck[key]
            assert msg.startswith("InvalidArgumentError: "), msg  # a py_function's ValueError, as TF reports it
            assert "RankMismatchError: ranks disagree on the compressor's step counters at its first step" in msg, msg
            assert "rank(s) [1] hold no step counter" in msg and "get_concrete_function" in msg, msg
            assert "dense/kernel:0: rank 0 at step 3 (past the warm-up of 2), rank 1 at step 0 (in the warm-up of " \
                   "2)" in msg and "broadcast_state(root_rank=0)" in msg, msg
        assert ck["forgot_steps"] == ([3] if r == 0 else [0]) and ck["after"] == 2.0, ck
        if r == 1:
            assert ck["rank0_next"] != ck["straight_next"], ck
        # 9. elastic
        el = rep["elastic"]
        for case, rec in el.items():
            if case == "restore":  # commit, a step, restore: the residuals and steps of the commit
                assert rec["moved"] and rec["back"] and rec["steps"] == [3] * len(rec["steps"]), rec
                continue
            assert rec["same"] == [True] * 3 and rec["patterns"] and all(rec["residuals"]), (case, rec)
            assert rec["steps"] and rec["steps"] == [3] * len(rec["steps"]), (case, rec)
        # 10. warm-up: steps 0-1 are stock Horovod's average (rounding only), 2-3 quantized (2-4
        # levels a bucket: far more than 1e-3 off somewhere); no residual written while warm
        wu = rep["warmup"]
        for spec in ("orq:levels=3,ef=true,warmup=2", "qsgd:levels=4,ef=true,warmup=2"):
            rec = wu[spec]
            assert max(rec["errs"][:2]) <= 1e-6 and min(rec["errs"][2:]) > 1e-3, (spec, rec)
            assert rec["residuals"][:2] == [0.0, 0.0] and rec["residuals"][2] > 0.0, (spec, rec)
            assert set(rec["steps"]) == {4} and ("gather" in rec["patterns"] or "summable" in rec["patterns"]), rec
        assert all(math.isfinite(v) for v in wu["fit"]["loss"]) and set(wu["fit"]["steps"]) == {8}, wu["fit"]
    assert len({rep["warmup"]["fit"]["weights"] for rep in reports.values()}) == 1  # ranks bitwise equal
    # 11. a rank that retraced alone finished its steps with the others (no hang), ranks equal
    for rep in reports.values():
        assert sorted(rep["ragged"]) == ["gather", "scatter", "summable"], rep["ragged"]
        assert all(set(rec["steps"]) == {3} for rec in rep["ragged"].values()), rep["ragged"]
    assert_ranks_equal({r: {"ragged": rep["ragged"]} for r, rep in reports.items()}, "ragged")
    for key in ("scale", "keys"):
        assert_ranks_equal({r: {key: {k: v for k, v in rep[key].items() if k != "trace"}} for r, rep in reports.items()},
                           key)
    # residuals are each rank's own (its own data): only what the reduction makes common must agree
    common = ("skipped", "scale_after", "weights", "finite")
    assert_ranks_equal({r: {"lossscale": {case: {f: rec[f] for f in common} for case, rec in rep["lossscale"].items()}}
                        for r, rep in reports.items()}, "lossscale")
