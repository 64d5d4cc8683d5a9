"""Elastic Horovod, in one process: the residual rule across worlds, commit/restore of the PyTorch
compressor's state, and that Horovod's ``TorchState`` hands the compressor to our handler (the
multi-rank run is tests/parallel/test_elastic_torch.py)."""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import hvd_gradq.torch as gq
from hvd_gradq.frontend.elastic import Generation, World, carry_over
from hvd_gradq.torch.elastic import CompressorStateHandler, of

hvd.init()  # one process: a one-rank Horovod job


@pytest.fixture(autouse=True)
def _horovod() -> None:
    """Another unit test of the same process may have shut Horovod down, or imported
    horovod.tensorflow, whose import points ``horovod.common.process_sets`` (a module global that
    ``hvd.DistributedOptimizer`` asks) at TensorFlow's uninitialised library: start PyTorch's again
    and point the process sets back at it."""
    from horovod.common import process_sets
    from horovod.torch.mpi_ops import _basics

    try:
        hvd.size()
    except ValueError:
        hvd.init()
    process_sets._setup(_basics)


W2 = World(2, 0, 2, 0, 0)
W3 = World(3, 0, 2, 0, 0)
KEYS = ["fc.weight", "fc.weight#reduce", "fc.bias#host", "fc.bias#host#reduce", "fc.bias"]


def test_worker_residuals_stay_owner_residuals_follow_the_world() -> None:
    assert carry_over(KEYS, W2, W2) == (KEYS, [])  # the same world: everything stays
    kept, dropped = carry_over(KEYS, W2, W3)
    assert kept == ["fc.weight", "fc.bias"]
    assert dropped == ["fc.weight#reduce", "fc.bias#host", "fc.bias#host#reduce"]
    # the same size but another place (a rank renumbered): its chunk is another one
    assert carry_over(KEYS, W2, World(2, 1, 2, 1, 0))[1] == dropped
    assert carry_over(KEYS, None, W3) == (KEYS, [])  # a fresh compressor has nothing to drop


def test_generation_prefix_only_in_elastic_jobs() -> None:
    assert Generation().prefix() == ""
    assert Generation(3).prefix() == "g3."


def _compressor() -> tuple[torch.nn.Module, gq.GradqCompressor, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    comp = gq.ORQ(levels=5, ef=True, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    return model, comp, opt


def test_commit_and_restore_roll_residuals_and_steps_back() -> None:
    model, comp, opt = _compressor()
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    e = of(comp)
    assert isinstance(e.handler, CompressorStateHandler)  # the optimizer's handler took the compressor
    comp._store.residuals = {"weight": torch.ones(8), "weight#reduce": torch.full((4,), 2.0)}
    comp._steps = {"weight": 5}
    state.save()
    comp._store.residuals["weight"].add_(1.0)  # a failed step's half-written residual
    comp._store.residuals["bias"] = torch.ones(2)
    comp._steps = {"weight": 6, "bias": 1}
    state.restore()
    assert set(comp._store.residuals) == {"weight", "weight#reduce"}
    assert torch.equal(comp._store.residuals["weight"], torch.ones(8))
    assert comp._steps == {"weight": 5}


def test_a_new_world_drops_owner_residuals_and_forgets_decisions() -> None:
    _, comp, opt = _compressor()
    hvd.elastic.TorchState(optimizer=opt)
    e = of(comp)
    comp._store.residuals = {"weight": torch.ones(8), "weight#reduce": torch.ones(4)}
    comp._checked.add("")
    comp._local = 2
    e.made_in = W2
    e.new_world(4, W3)
    assert list(comp._store.residuals) == ["weight"]
    assert comp._checked == set() and comp._local is None
    assert e.prefix() == "g4." and e.made_in == W3


def test_the_compressor_passed_twice_is_handled_once() -> None:
    model, comp, opt = _compressor()
    state = hvd.elastic.TorchState(model, opt, compression=comp)
    owners = [h for h in state._handlers.values() if isinstance(h, CompressorStateHandler)]
    assert len(owners) == 1 and of(comp).handler is not owners[0]  # the optimizer's inner handler owns it
    comp._steps = {"w": 1}
    owners[0].save()  # the stale one does nothing
    assert of(comp).saved is not None and of(comp).saved.steps == {}
