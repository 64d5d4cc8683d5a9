"""The reduction core (hvd_gradq/reduce/) on its loopback transport, against oracles written
here from the public API (quantize / dequantize) and the patterns' documented rules: what every
rank's reduction must equal, bit for bit; and the loopback's collectives against their
definitions. (PyTorch's driver of the same core is checked against Horovod in tests/parallel.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hvd_gradq
from hvd_gradq import reduce as core
from hvd_gradq.errors import GradqError, NonFiniteError
from hvd_gradq.feedback import Memory
from hvd_gradq.plan.decide import Choice
from hvd_gradq.plan.layout import chunk_bounds
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.plan.second_phase import reduced_scheme
from hvd_gradq.reduce.names import words
from hvd_gradq.reduce.stats import Stats
from hvd_gradq.reduce.table import owner_residuals, phases
from hvd_gradq.torch.ops import TorchOps
from hvd_gradq.torch.store import TensorStore
from hvd_gradq.torch.transport import TorchCodec

CPU = TorchOps("cpu")
SEED = 11


#: How a rank's codec keeps what the patterns decode (PyTorch's Reducer.start): "own" keeps this
#: rank's decoded values from the encode (error feedback needs them), "decode" decodes its own
#: payload with the others (where error feedback is off), "into" also writes the result into the input's own storage (Horovod's
#: optimizer: the gradient, read by then). Every way gives the same bits.
CODECS = ("own", "decode", "into")


def run(spec: str, xs: list[torch.Tensor], make, step: int = 0, local: int = 1, codec: str = "own",
        **kw) -> list[torch.Tensor]:
    cfg = hvd_gradq.parse(spec)
    w = len(xs)
    gens = []
    for r, x in enumerate(xs):
        red = core.Reduction(cfg, SEED, r, Memory(CPU, TensorStore()), Stats(), CPU)
        red.stats.decide("t", "p", "", x.numel(), w)
        own = codec == "own" or cfg.policy.ef  # error feedback subtracts them: Reducer.start's rule
        part = core.Part("t", step, core.Group(r, w, "", local), TorchCodec(False, own=own),
                         out=x if codec == "into" else None)
        gens.append(make(red, part, x, **kw))
    outs = core.lockstep(CPU, gens)
    if codec == "into":  # the results went into the inputs' storage
        assert all(o.data_ptr() == x.data_ptr() for o, x in zip(outs, xs))
    return outs


def via(pattern: Pattern, cross: Pattern = Pattern.GATHER):
    """The pattern's phases as every driver starts them: through the core's one table."""
    return lambda red, part, x: phases(Choice(pattern, "", cross), red, part, x, CPU)


def payload_values(scheme, x: np.ndarray, rank: int, key: str, step: int = 0) -> np.ndarray:
    """What rank ``rank`` sends for ``x`` under the seeds' rule, decoded: the public API."""
    p = hvd_gradq.quantize(x, scheme, seed=words(SEED, rank, key, step))
    return hvd_gradq.dequantize(p).astype(np.float32).reshape(-1)


def grads(w: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(w)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("spec", ["orq:levels=5", "qsgd:levels=4", "terngrad", "bingrad", "topk:ratio=0.1", "none"])
def test_gather_is_the_sum_of_every_ranks_payload_in_rank_order(spec: str, codec: str) -> None:
    xs = grads(3, 3000)
    outs = run(spec, [x.clone() for x in xs], via(Pattern.GATHER), step=2, codec=codec)
    scheme = hvd_gradq.parse(spec).scheme
    expect = payload_values(scheme, xs[0].numpy(), 0, "t", 2)
    for r in (1, 2):
        expect = expect + payload_values(scheme, xs[r].numpy(), r, "t", 2)
    for out in outs:
        assert np.array_equal(out.numpy(), expect)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("spec,w", [("orq:levels=5", 4), ("qsgd:levels=4", 3), ("bingrad", 2)])
def test_scatter_reduces_each_chunk_then_sends_it_by_the_second_phase_scheme(spec: str, w: int, codec: str) -> None:
    xs = grads(w, 5000, seed=1)
    scheme = hvd_gradq.parse(spec).scheme
    outs = run(spec, [x.clone() for x in xs], via(Pattern.SCATTER), step=1, codec=codec)
    pieces = []
    for j, (lo, hi) in enumerate(chunk_bounds(5000, scheme.bucket, w)):
        part = payload_values(scheme, xs[0].numpy()[lo:hi], 0, f"t#{j}", 1)
        for r in range(1, w):
            part = part + payload_values(scheme, xs[r].numpy()[lo:hi], r, f"t#{j}", 1)
        pieces.append(payload_values(reduced_scheme(scheme, w), part, j, "t#reduce", 1))  # owner j's draws
    expect = np.concatenate(pieces)
    for out in outs:
        assert np.array_equal(out.numpy(), expect)


def test_summable_is_unbiased_within_one_step_a_rank_and_equal_everywhere() -> None:
    xs = grads(3, 4096, seed=2)
    outs = run("qsgd:levels=4", xs, via(Pattern.SUMMABLE))
    exact = sum(x.numpy().astype(np.float64) for x in xs)
    scheme = hvd_gradq.parse("qsgd:levels=4").scheme
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    # each rank rounds each element to one of the two neighbouring levels of the table shared by
    # the bucket (its max over ranks): at most one level spacing from its value
    b = scheme.bucket
    top = np.max([np.abs(x.numpy()).reshape(-1, b).max(axis=1) for x in xs], axis=0)
    step = np.repeat(2 * top / (4 - 1), b)  # the coarsest layout of 4 even levels over [-top, top]
    assert np.all(np.abs(outs[0].numpy() - exact) <= 3 * step * (1 + 1e-6))


def test_hierarchical_sums_inside_hosts_exactly_then_gathers_across_them() -> None:
    w, local, n = 4, 2, 3000
    xs = grads(w, n, seed=3)
    spec = "orq:levels=5"
    scheme = hvd_gradq.parse(spec).scheme
    outs = run(spec, xs, via(Pattern.HIERARCHICAL, Pattern.GATHER), local=local)
    pieces = chunk_bounds(n, scheme.bucket, local)
    expect = []
    for i, (lo, hi) in enumerate(pieces):  # piece i: owned by local rank i on each host
        total = None
        for host in range(w // local):
            s = xs[host * local][lo:hi].clone()
            for k in range(1, local):
                s += xs[host * local + k][lo:hi]
            v = payload_values(scheme, s.numpy(), host * local + i, "t#host")
            total = v if total is None else total + v
        expect.append(total)
    for out in outs:
        assert np.array_equal(out.numpy(), np.concatenate(expect))


def test_a_rank_with_nan_under_raise_stops_every_rank_after_the_collective() -> None:
    xs = grads(2, 2000)
    xs[1][5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"rank\(s\) \[1\]"):
        run("orq:levels=5,nonfinite=raise", xs, via(Pattern.GATHER))


def test_owner_residuals_are_as_wide_as_the_widest_part_on_any_rank() -> None:
    # 10 buckets of 512 over 4 ranks: chunks of 2, 3, 2, 3 buckets (the last one short)
    n, b = 9 * 512 + 100, 512
    g = core.Group(1, 4, "", 1)
    widest = max(hi - lo for lo, hi in chunk_bounds(n, b, 4))
    assert widest == 3 * 512
    assert owner_residuals(Choice(Pattern.SCATTER, ""), True, "w", n, b, g) == [("w#reduce", widest)]
    assert owner_residuals(Choice(Pattern.SCATTER, ""), False, "w", n, b, g) == []
    assert owner_residuals(Choice(Pattern.GATHER, ""), True, "w", n, b, g) == []
    assert owner_residuals(Choice(Pattern.SUMMABLE, ""), True, "w", n, b, g) == []
    # hierarchical, 2 hosts of 2: pieces of 5 buckets (the second short); sub-pieces of 3 buckets
    h = core.Group(3, 4, "", 2)
    assert owner_residuals(Choice(Pattern.HIERARCHICAL, "", Pattern.GATHER), True, "w", n, b, h) == [
        ("w#host", 5 * 512)]
    assert owner_residuals(Choice(Pattern.HIERARCHICAL, "", Pattern.SCATTER), True, "w", n, b, h) == [
        ("w#host", 5 * 512), ("w#host#reduce", 3 * 512)]


def test_loopback_collectives_follow_their_definitions() -> None:
    a, b = np.arange(5, dtype=np.uint8), np.arange(10, 13, dtype=np.uint8)

    def ask(buf, splits):
        got = yield core.Alltoall("x", buf, splits)
        got2 = yield core.Allgather("y", buf[:2])
        got3 = yield core.Allreduce("z", torch.tensor([float(buf[0]), 7.0]), "max")
        return got, got2, got3

    r0, r1 = core.lockstep(CPU, [ask(a, (2, 3)), ask(b, (1, 2))])
    assert list(r0[0]) == [0, 1, 10] and list(r1[0]) == [2, 3, 4, 11, 12]
    assert list(r0[1]) == list(r1[1]) == [0, 1, 10, 11]
    assert r0[2].tolist() == [10.0, 7.0]

    def other(name):
        yield core.Allgather(name, a)
        return None

    with pytest.raises(GradqError, match="would hang"):
        core.lockstep(CPU, [other("p"), other("q")])
