"""Resuming and installing (issue 35): the comparison of step counters the first step makes
(hvd_gradq/frontend/resume.py), the Horovod version check at a frontend's import
(hvd_gradq/frontend/versions.py), the extras that check it, and, in a one-rank Horovod job, a
checkpoint of another model named with both shapes and ``broadcast_state``'s arguments. The
2-rank recipe (rank 0 loads, then Horovod's broadcasts) is tests/parallel/test_torch_hardening.py."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hvd_gradq.errors import GradqError, RankMismatchError
from hvd_gradq.frontend import resume, versions

ROOT = Path(__file__).resolve().parents[2]


# -- the counters' comparison ------------------------------------------------------------------------
def test_digest_is_equal_for_equal_counters_whatever_their_order() -> None:
    assert resume.digest({"a": 3, "b": 4}) == resume.digest({"b": 4, "a": 3})
    assert resume.digest({"a": 3, "b": 4}) != resume.digest({"a": 3, "b": 5})
    assert resume.digest({})[0] == 0


def test_a_fresh_rank_beside_a_loaded_one_is_named_with_the_warmup_and_the_fix() -> None:
    msg = resume.disagreement([{"fc.weight": 6, "fc.bias": 6}, {}], warmup=4)
    assert msg is not None
    assert "rank(s) [1] hold no step counter (a fresh compressor" in msg, msg
    assert "fc.weight: rank 0 at step 6 (past the warm-up of 4), rank 1 at step 0 (in the warm-up of 4)" in msg
    assert "compression.broadcast_state(root_rank=0)" in msg and "state_dict(all_ranks=True)" in msg


def test_counters_that_differ_are_named_and_counted_past_the_first_few() -> None:
    a = {f"t{i}": 5 for i in range(resume.SHOWN + 2)}
    b = {**a, "t0": 2, "t1": 2, "t2": 2, "t3": 2, "t4": 2}
    msg = resume.disagreement([a, b], warmup=0)
    assert msg is not None and "t0: rank 0 at step 5, rank 1 at step 2" in msg and "and 2 more tensor(s)" in msg
    assert "fresh" not in msg


def test_counters_held_by_some_ranks_only_are_no_disagreement() -> None:
    # a tensor reduced over a process set that leaves rank 1 out counts on rank 0 only
    assert resume.disagreement([{"w": 3, "only0": 3}, {"w": 3}], warmup=2) is None
    assert resume.disagreement([{}, {}], warmup=2) is None
    assert resume.differing([{"w": 3}, {"w": 4}, {}]) == {"w": {0: 3, 1: 4, 2: 0}}


class Ranks:
    """Every rank's counters, and an allgather over them for ``compare`` (one rank's view: what
    it sends is ignored, every rank's ``counters`` come back), recording the phases it ran."""

    def __init__(self, *counters: dict) -> None:
        self.counters, self.phases = counters, []

    def allgather(self, obj, phase):
        self.phases.append(phase)
        return [resume.digest(c) for c in self.counters] if phase is None else [dict(c) for c in self.counters]


def test_compare_gathers_the_counters_only_where_the_digests_differ() -> None:
    same = Ranks({"w": 3, "b": 3}, {"b": 3, "w": 3})
    resume.compare(same.counters[0], same.allgather, warmup=2)
    assert same.phases == [None]  # one small collective when they agree
    fresh = Ranks({"w": 3}, {})
    with pytest.raises(RankMismatchError, match=r"rank\(s\) \[1\] hold no step counter") as info:
        resume.compare(fresh.counters[0], fresh.allgather, warmup=2, fix="Do it this way")
    assert fresh.phases == [None, 2] and str(info.value).endswith("Do it this way")
    assert "w: rank 0 at step 3 (past the warm-up of 2), rank 1 at step 0 (in the warm-up of 2)" in str(info.value)
    # digests differ, counters agree where both ranks hold them (a process set of rank 0 only): no error
    sets = Ranks({"w": 3, "only0": 3}, {"w": 3})
    resume.compare(sets.counters[1], sets.allgather, warmup=0)
    assert sets.phases == [None, 2]


def test_the_tensorflow_check_counts_a_zero_as_none_runs_once_and_raises_at_every_step() -> None:
    """hvd_gradq.tensorflow.resume.FirstStep's check, eagerly (its allgather replaced by two
    ranks' rows): a slot that never stepped (0) counts as no counter; a disagreement is raised
    again at every later step and leaves the gate shut; an agreement opens it, once."""
    tf = pytest.importorskip("tensorflow")
    tf_resume = pytest.importorskip("hvd_gradq.tensorflow.resume")
    steps = {"a": tf.Variable(np.int64(0)), "b": tf.Variable(np.int64(4))}
    other = {"b": 4}  # rank 1 never stepped "a" either: the same rows, whatever "a" holds here

    def check(theirs):
        fs = tf_resume.FirstStep(True, "c0.", warmup=0)
        fs._pending = tf.Variable(True)
        rows = Ranks(theirs)

        def allgather(obj, phase):  # rank 0 is this one, rank 1 sends ``theirs``
            return [obj, rows.allgather(None, phase)[0]]

        fs._allgather = allgather
        return fs, rows

    fs, rows = check(other)
    fs._run(steps)
    fs._run(steps)  # once: a second slot after the first does not gather again
    assert rows.phases == [None] and not bool(fs._pending.numpy())
    fs, rows = check({})
    for _ in range(2):
        with pytest.raises(RankMismatchError, match=r"rank\(s\) \[1\] hold no step counter") as info:
            fs._run(steps)
        assert "b: rank 0 at step 4, rank 1 at step 0" in str(info.value) and "get_concrete_function" in str(info.value)
    assert rows.phases == [None, 2] and bool(fs._pending.numpy())


# -- the Horovod version ----------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.28.1", "0.28.1+cu118", "0.28.2rc1", "v0.28.1"])
def test_supported_horovod_versions_import(version: str) -> None:
    versions.check_horovod(version, "hvd_gradq.torch")


@pytest.mark.parametrize("version", ["0.27.2", "0.28.0", "0.29.0", "1.0", "", None, "dev"])
def test_other_horovod_versions_are_refused_saying_why_and_what_to_do(version: Any, monkeypatch) -> None:
    monkeypatch.delenv(versions.ENV, raising=False)
    with pytest.raises(GradqError) as info:
        versions.check_horovod(version, "hvd_gradq.torch")
    msg = str(info.value)
    assert msg.startswith("hvd_gradq.torch supports Horovod >=0.28.1,<0.29 (tested: 0.28.1)"), msg
    assert "calling frames" in msg and "horovod==0.28.1" in msg and f"{versions.ENV}=1" in msg, msg


def test_the_escape_hatch_warns_instead(monkeypatch) -> None:
    monkeypatch.setenv(versions.ENV, "1")
    with pytest.warns(RuntimeWarning, match="supports Horovod >=0.28.1"):
        versions.check_horovod("0.27.2", "hvd_gradq.tensorflow")


def test_the_installed_horovod_is_read(monkeypatch) -> None:
    horovod = pytest.importorskip("horovod")
    monkeypatch.delenv(versions.ENV, raising=False)
    monkeypatch.setattr(horovod, "__version__", "0.26.1")
    with pytest.raises(GradqError, match=r"this is Horovod 0\.26\.1"):
        versions.require_horovod("hvd_gradq.torch")
    monkeypatch.setattr(horovod, "__version__", "0.28.1")
    versions.require_horovod("hvd_gradq.torch")


def test_importing_the_torch_frontend_with_another_horovod_is_refused() -> None:
    pytest.importorskip("horovod.torch")
    code = ("import horovod; horovod.__version__ = '0.27.0'\n"
            "try:\n    import hvd_gradq.torch\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    assert out.startswith("GradqError hvd_gradq.torch supports Horovod >=0.28.1"), out


def test_extras_take_the_supported_horovod_and_force_no_framework_flavour() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {k: [r.strip() for r in v.splitlines() if r.strip() and not r.strip().startswith("#")]
              for k, v in cfg["options.extras_require"].items()}
    low, high = (".".join(map(str, v)) for v in versions.SUPPORTED)
    for name in ("torch", "tensorflow"):
        assert f"horovod>={low},<{high}" in extras[name], extras[name]
    assert not [r for r in extras["tensorflow"] if r.startswith("tensorflow")], extras["tensorflow"]


# -- in a one-rank Horovod job (PyTorch) ------------------------------------------------------------
@pytest.fixture
def hvd() -> Any:
    """horovod.torch, initialised (see tests/unit/test_elastic.py's fixture for why again)."""
    hvd = pytest.importorskip("horovod.torch")
    from horovod.common import process_sets
    from horovod.torch.mpi_ops import _basics

    try:
        hvd.size()
    except ValueError:
        hvd.init()
    process_sets._setup(_basics)
    return hvd


def _state(comp: Any, residuals: dict[str, Any], shapes: dict[str, list[int]]) -> dict[str, Any]:
    return {"config": comp.config(), "rank": 0, "size": 1, "steps": dict.fromkeys(residuals, 3),
            "residuals": residuals, "shapes": shapes}


def test_a_checkpoint_of_other_shapes_without_named_parameters_names_the_tensor_and_both_shapes(hvd) -> None:
    import torch

    import hvd_gradq.torch as gq

    comp = gq.BinGrad(ef=True)
    comp.load_state_dict(_state(comp, {"w": torch.zeros(10)}, {"w": [2, 5]}))
    with pytest.raises(GradqError) as info:  # before: a bare torch size error at the next step
        hvd.allreduce(torch.ones(4, 3), name="w", compression=comp)
    msg = str(info.value)
    assert msg.startswith("w: the checkpoint's error-feedback residual was made for a gradient of shape [2, 5] "
                          "(10 elements); this model's w has shape [4, 3] (12 elements)"), msg
    assert "load it into the model it was saved with, or leave it out" in msg, msg


def test_a_checkpoint_of_other_shapes_is_refused_at_load_with_named_parameters(hvd) -> None:
    import torch

    import hvd_gradq.torch as gq

    model = torch.nn.Linear(4, 2)
    comp = gq.BinGrad(ef=True, named_parameters=model.named_parameters())
    with pytest.raises(GradqError, match=r"weight: .* shape \[3, 4\] \(12 elements\); this model's weight has "
                                         r"shape \[2, 4\] \(8 elements\)"):
        comp.load_state_dict(_state(comp, {"weight": torch.zeros(12)}, {"weight": [3, 4]}))
    with pytest.raises(GradqError, match=r"parameters this model does not have: \[.fc\.weight.\]"):
        comp.load_state_dict(_state(comp, {"fc.weight": torch.zeros(8)}, {}))
    assert comp._steps == {} and comp._residuals == {}  # nothing changed by a refused state


def test_state_dict_records_the_gradient_shapes_and_a_fitting_state_loads(hvd) -> None:
    import torch

    import hvd_gradq.torch as gq

    comp = gq.BinGrad(ef=True)
    comp.load_state_dict(_state(comp, {"w": torch.zeros(12)}, {"w": [4, 3]}))
    out = hvd.allreduce(torch.ones(4, 3), name="w", compression=comp)  # one rank: passed through
    assert torch.equal(out, torch.ones(4, 3))
    assert comp.state_dict()["shapes"] == {"w": [4, 3]}


def test_broadcast_state_checks_its_root_and_keeps_one_ranks_state(hvd) -> None:
    import torch

    import hvd_gradq.torch as gq

    comp = gq.BinGrad(ef=True)
    comp.load_state_dict(_state(comp, {"w": torch.ones(12)}, {"w": [4, 3]}))
    for bad in (1, -1, True, "0"):
        with pytest.raises(GradqError, match=r"root_rank must be a rank of this job \(0 to 0\)"):
            comp.broadcast_state(root_rank=bad)
    comp.broadcast_state(root_rank=0)
    assert comp._steps == {"w": 3} and torch.equal(comp._residuals["w"], torch.ones(12))


def test_compiled_error_feedback_writes_into_no_checkpoints_tensors(hvd) -> None:
    """Error feedback writes each step's residual into the buffer of the step before last
    (hvd_gradq.feedback.Memory): a checkpoint loaded, and one taken, must not change under it."""
    import torch

    import hvd_gradq.torch as gq

    comp = gq.BinGrad(ef=True)
    loaded = {"w": torch.full((12,), 0.5)}
    comp.load_state_dict(_state(comp, dict(loaded), {"w": [12]}))
    taken = []
    for step in range(4):
        comp.memory.begin_step(None)
        x = comp.memory.compensate("w", torch.ones(12))
        comp.memory.update("w", x, torch.full((12,), float(step)))
        state = comp.state_dict()
        taken.append((state, state["residuals"]["w"].clone()))
    assert torch.equal(loaded["w"], torch.full((12,), 0.5))
    for state, copy in taken:
        assert torch.equal(state["residuals"]["w"], copy)
    # e <- (1 + e) - step, from the loaded 0.5: the rule ran on the residuals it wrote
    assert [float(copy[0]) for _, copy in taken] == [1.5, 1.5, 0.5, -1.5]
