"""Corruption in transit (issue 35, items 7 and 11): every byte hvd_gradq sends is checked, and a
mismatch stops every rank with an error naming the tensor, the step, the rank that found it and
the sender.

The patterns run on the loopback's N ranks; :func:`tampered` changes what one rank receives from
one collective (a bit flipped, a pair of errors that cancel under a weighted sum), as a bad link
or NIC would. The drive here records each rank's outcome, so that a rank that goes on while
another raises is seen. Before the checks, these corruptions went through silently (the ranks'
results differed from that step on) or raised on the receiving rank only, naming nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import hvd_gradq
from hvd_gradq import reduce as core
from hvd_gradq.feedback import Memory
from hvd_gradq.plan.decide import Choice
from hvd_gradq.plan.pattern import Pattern
from hvd_gradq.reduce.integrity import error_of
from hvd_gradq.reduce.names import Kind, collective
from hvd_gradq.reduce.stats import Stats
from hvd_gradq.reduce.table import phases
from hvd_gradq.reduce.verdicts import Verdicts, left_alone, settle
from hvd_gradq.torch.ops import TorchOps
from hvd_gradq.torch.store import TensorStore
from hvd_gradq.torch.transport import TorchCodec
from hvd_gradq.xp import NUMPY

CPU = TorchOps("cpu")
SEED = 11
STEP = 4

#: (request, rank, result) -> what that rank receives
Corrupt = Callable[[Any, int, Any], Any]


def tampered(gen: core.Phases, rank: int, corrupt: Corrupt) -> core.Phases:
    """``gen`` with every result it receives passed through ``corrupt`` first."""
    req = next(gen)
    while True:
        got = yield req
        try:
            req = gen.send(corrupt(req, rank, got))
        except StopIteration as stop:
            return stop.value


def drive(gens: list[core.Phases], ops: Any = CPU) -> list[Any]:
    """The loopback's lock step, with each rank's outcome kept: its result, or the exception it
    raised. Ranks still running must ask for the same collective (else a real job would hang)."""
    out: list[Any] = [None] * len(gens)
    live = {r: next(g) for r, g in enumerate(gens)}
    while live:
        names = {type(q).__name__ + q.name for q in live.values()}
        assert len(names) == 1, f"ranks {sorted(live)} ask for different collectives {names}: a real job hangs"
        ranks = sorted(live)
        answers = core.loopback._answer(ops, [live[r] for r in ranks])
        if len(ranks) < len(gens):
            raise AssertionError(f"ranks {sorted(set(range(len(gens))) - set(ranks))} ended, ranks {ranks} "
                                 f"wait in {next(iter(names))}: a real job hangs")
        for r, a in zip(ranks, answers):
            try:
                live[r] = gens[r].send(a)
            except StopIteration as stop:
                out[r] = stop.value
                del live[r]
            except Exception as e:  # kept, to compare ranks
                out[r] = e
                del live[r]
    return out


def run(spec: str, xs: list[torch.Tensor], pattern: Pattern, corrupt: Corrupt | None = None,
        cross: Pattern = Pattern.GATHER, local: int = 1, name: str = "t",
        verdicts: list[Verdicts] | None = None) -> list[Any]:
    """Each rank's outcome of tensor ``name``'s reduction; with ``verdicts`` (one a rank), one
    verdict a step, as PyTorch's driver runs it: the findings go to each rank's record."""
    cfg = hvd_gradq.parse(spec)
    gens = []
    for r, x in enumerate(xs):
        group = core.Group(r, len(xs), "", local)
        record = None if verdicts is None else verdicts[r].record(group, name, STEP)
        red = core.Reduction(cfg, SEED, r, Memory(CPU, TensorStore()), Stats(), CPU, findings=record)
        red.stats.decide(name, "p", "", x.numel(), len(xs))
        part = core.Part(name, STEP, group, TorchCodec(False))
        gen = phases(Choice(pattern, "", cross), red, part, x, CPU)
        gens.append(gen if corrupt is None else tampered(gen, r, corrupt))
    return drive(gens)


def settle_all(verdicts: list[Verdicts]) -> list[Any]:
    """Each rank's outcome of the step's verdict (None, or the error it raised): the records
    closed, one a rank (one group), under one name."""
    records = [v.close() for v in verdicts]
    assert all(len(r) == 1 for r in records)
    assert len({r[0].name for r in records}) == 1, [r[0].name for r in records]
    return drive([settle(r[0]) for r in records], NUMPY)


def grads(w: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(w)]


def at(kind: Kind, victim: int, change: Callable[[Any], Any], phase: int | None = None, tensor: str = "t") -> Corrupt:
    """Change what rank ``victim`` receives from the collective of ``kind`` (a copy: results may
    be shared between ranks)."""
    name = collective("", kind, tensor, phase)

    def corrupt(req: Any, rank: int, got: Any) -> Any:
        if rank != victim or req.name != name:
            return got
        copy = got.copy() if isinstance(got, np.ndarray) else got.clone() if isinstance(got, torch.Tensor) else got
        return change(copy)

    return corrupt


def flip(index: int, bit: int) -> Callable[[Any], Any]:
    def change(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            a[index] ^= np.uint8(1 << bit)
        elif a.is_floating_point():
            v = a.view(torch.int32)
            v[index] ^= 1 << bit
        else:
            a[index] ^= 1 << bit
        return a
    return change


def every_rank_raised(outs: list[Any], finder: int, sender: int | None, words: str, tensor: str = "t") -> str:
    """Every rank raised the same CorruptionError, naming the tensor and step, the finder and the sender."""
    assert all(isinstance(o, hvd_gradq.CorruptionError) for o in outs), [type(o).__name__ for o in outs]
    texts = {str(o) for o in outs}
    assert len(texts) == 1, texts
    text = texts.pop()
    assert text.startswith(f"{tensor} (step {STEP}): data corrupted in transit")
    assert f"found by rank {finder}" in text and words in text, text
    if sender is not None:
        assert f"rank {sender} sent" in text, text
    return text


def payload_at(buf: np.ndarray, k: int) -> int:
    """Where the k-th payload of a gathered buffer starts."""
    pos = 0
    for _ in range(k):
        pos = hvd_gradq.wire.read_header(buf, pos).end
    return pos


# -- clean runs: the checks change no result ----------------------------------------------------


@pytest.mark.parametrize("pattern", [Pattern.GATHER, Pattern.SCATTER, Pattern.SUMMABLE])
def test_without_corruption_every_rank_gets_the_same_sum(pattern: Pattern) -> None:
    outs = run("qsgd:levels=4", grads(3, 3000), pattern)
    assert all(isinstance(o, torch.Tensor) for o in outs)
    assert all(torch.equal(o, outs[0]) for o in outs)


# -- gather: payloads ----------------------------------------------------------------------------


def in_payload(k: int, offset: int, mask: int) -> Callable[[np.ndarray], np.ndarray]:
    """Flip ``mask`` in byte ``offset`` of the k-th payload of a received buffer."""
    def change(buf: np.ndarray) -> np.ndarray:
        buf[payload_at(buf, k) + offset] ^= mask
        return buf
    return change


def test_a_flipped_bit_in_a_gathered_payload_stops_every_rank_naming_sender_and_finder() -> None:
    # in rank 2's payload, as rank 1 receives it
    outs = run("orq:levels=5", grads(3, 3000), Pattern.GATHER, at(Kind.GATHER, 1, in_payload(2, 100, 0x10)))
    every_rank_raised(outs, finder=1, sender=2, words="the allgather of payloads fails its CRC-32")


def test_errors_that_cancel_under_the_old_weighted_sum_stop_every_rank() -> None:
    """+2 at byte a, -1 at byte 2a + 1 of a payload (weights a + 1 and 2(a + 1) under the
    version-2 checksum: it did not change) went through and decoded to other values on one rank."""
    def change(buf: np.ndarray) -> np.ndarray:
        start = payload_at(buf, 1)
        end = payload_at(buf, 2)
        raw = buf[start:end]
        for a in range(40, (raw.shape[0] - 1) // 2):
            b = 2 * a + 1
            if not raw[a] & 2 and raw[b] & 1:
                raw[a] ^= 2
                raw[b] ^= 1
                zeroed = raw.copy()
                zeroed[16:20] = 0
                weights = 1 + np.arange(raw.shape[0]) % 65521
                before = (np.dot(zeroed.astype(np.int64), weights) - 2 * (a + 1) + 2 * (a + 1)) % (1 << 32)
                assert before == np.dot(zeroed.astype(np.int64), weights) % (1 << 32)
                return buf
        raise AssertionError("no pair to change")

    outs = run("orq:levels=5", grads(3, 3000), Pattern.GATHER, at(Kind.GATHER, 0, change))
    every_rank_raised(outs, finder=0, sender=1, words="fails its CRC-32")


# -- scatter: chunks and reduced chunks ----------------------------------------------------------


def test_a_corrupted_chunk_stops_every_rank_though_only_its_owner_received_it() -> None:
    # rank 0's chunk, at its owner rank 2
    outs = run("orq:levels=5", grads(3, 6000), Pattern.SCATTER, at(Kind.ALLTOALL, 2, in_payload(0, 40, 0x01)))
    every_rank_raised(outs, finder=2, sender=0, words="the alltoall of chunk payloads")


def test_a_corrupted_reduced_chunk_stops_every_rank() -> None:
    outs = run("orq:levels=5", grads(3, 6000), Pattern.SCATTER, at(Kind.REDUCED, 0, flip(-5, 3)))
    every_rank_raised(outs, finder=0, sender=2, words="the allgather of reduced chunks")


# -- summable: lanes and statistics ---------------------------------------------------------------


@pytest.mark.parametrize("bit", [0, 7, 30])
def test_a_flipped_bit_in_the_summed_lanes_stops_every_rank(bit: int) -> None:
    outs = run("qsgd:levels=4", grads(3, 4096, seed=2), Pattern.SUMMABLE, at(Kind.LANES, 1, flip(17, bit)))
    every_rank_raised(outs, finder=1, sender=None, words="the summed lanes of the Sum-allreduce of lanes fail their "
                                                          "checksum: the sum of ranks 0..2's lanes was corrupted")


def test_lane_errors_that_cancel_under_fixed_weights_stop_every_rank() -> None:
    """+2 at lane a, -1 at lane 2a + 1: what a checksum of weights 1 + i (the old payload sum's)
    would miss; the lanes' weights are pseudo-random, mod 2**31 - 1."""
    def change(lanes: torch.Tensor) -> torch.Tensor:
        lanes[30] += 2
        lanes[61] -= 1
        return lanes

    outs = run("terngrad", grads(4, 4096, seed=3), Pattern.SUMMABLE, at(Kind.LANES, 3, change))
    every_rank_raised(outs, finder=3, sender=None, words="fail their checksum")


DIFFERENT_STATISTICS = (
    f"t (step {STEP}): data corrupted in transit: the ranks received different statistics from the Max-allreduce of "
    "statistics (the digests summed in the lanes differ from each rank's own); every rank stops here, since their "
    "results would differ from this step on (check the network, NICs and memory of the ranks named, and resume from "
    "a checkpoint)")


def test_statistics_corrupted_on_the_way_to_one_rank_stop_every_rank() -> None:
    """A flipped exponent bit raises a maximum on rank 2 alone: it encodes against another scale
    than the others (its lanes pass their checksum); the digests it and the others sent in the
    lanes differ, which every rank sees in the summed lanes."""
    outs = run("qsgd:levels=4", grads(3, 4096, seed=4), Pattern.SUMMABLE, at(Kind.STATS, 2, flip(3, 24)))
    assert all(isinstance(o, hvd_gradq.CorruptionError) for o in outs), outs
    assert {str(o) for o in outs} == {DIFFERENT_STATISTICS}


def test_statistics_corrupted_into_a_peers_stop_signal_stop_every_rank_alike() -> None:
    """A flipped top exponent bit turns a statistic in [0.5, 1) into one above 2**127, which reads
    as "rank r's value is beyond the range" (a stop every rank would have met alike): rank 0 alone
    reads it. Every rank raises the CorruptionError instead (the digests in the lanes come first),
    none a RangeError that the others never pass the barrier of."""
    xs = [x.clamp(-0.5, 0.5) for x in grads(3, 4096, seed=9)]
    xs[1][5] = 0.75  # bucket 0's maximum in [0.5, 1): exponent 126, flipped to 254 (2.55e38)
    outs = run("qsgd:levels=4", xs, Pattern.SUMMABLE, at(Kind.STATS, 0, flip(0, 30)))
    assert all(isinstance(o, hvd_gradq.CorruptionError) for o in outs), outs
    assert {str(o) for o in outs} == {DIFFERENT_STATISTICS}


def test_statistics_lowered_below_a_ranks_own_are_named_by_that_rank() -> None:
    """Every rank received the same statistics (a corruption before the result was spread), one
    of them lowered below rank 1's own: rank 1 names it."""
    xs = grads(3, 4096, seed=5)
    xs[1][600] = 50.0  # bucket 1's maximum is rank 1's
    def lower(stats: torch.Tensor) -> torch.Tensor:
        stats[1] = stats[1] / 4
        return stats

    corrupt = [at(Kind.STATS, r, lower) for r in range(3)]
    outs = run("qsgd:levels=4", xs, Pattern.SUMMABLE, lambda q, r, got: corrupt[r](q, r, got))
    every_rank_raised(outs, finder=1, sender=None, words="the statistics it received from the Max-allreduce of "
                                                          "statistics are below its own")


# -- hierarchical: fp32 pieces and cross payloads --------------------------------------------------


@pytest.mark.parametrize("phase,victim,index,sender", [(1, 1, 10, 0), (1, 3, 1600, 3), (3, 0, 2000, 1)])
def test_a_flipped_bit_in_an_fp32_piece_stops_every_rank(phase: int, victim: int, index: int, sender: int) -> None:
    # 4 ranks, 2 a host, 3000 elements: pieces of 1536 and 1464 (+2 check elements each)
    outs = run("orq:levels=5", grads(4, 3000, seed=6), Pattern.HIERARCHICAL,
               at(Kind.HIER, victim, flip(index, 5), phase), local=2)
    every_rank_raised(outs, finder=victim, sender=sender, words=f"the fp32 piece rank {sender} sent in hierarchical "
                                                                 f"phase h{phase} fails its CRC-32")


def test_a_corrupted_cross_payload_stops_every_rank() -> None:
    outs = run("orq:levels=5", grads(4, 3000, seed=7), Pattern.HIERARCHICAL, at(Kind.HIER, 3, flip(-9, 2), 2),
               local=2)
    every_rank_raised(outs, finder=3, sender=3, words="hierarchical phase h2 fails its CRC-32")


# -- one verdict a step (PyTorch's driver): the patterns note their findings, one collective -------

#: (pattern, spec, ranks, elements, seed, local, corrupt, finder, sender, words, forwarded): the
#: corruptions above; ``forwarded``: the ranks the finder passes its zeros on to in this step
STEP_CASES = {
    "gather": (Pattern.GATHER, "orq:levels=5", 3, 3000, 0, 1, at(Kind.GATHER, 1, in_payload(2, 100, 0x10)), 1, 2,
               "the allgather of payloads fails its CRC-32", set()),
    "chunk": (Pattern.SCATTER, "orq:levels=5", 3, 6000, 0, 1, at(Kind.ALLTOALL, 2, in_payload(0, 40, 0x01)), 2, 0,
              "the alltoall of chunk payloads", {0, 1}),  # the owner's reduced chunk, to every rank
    "reduced": (Pattern.SCATTER, "orq:levels=5", 3, 6000, 0, 1, at(Kind.REDUCED, 0, flip(-5, 3)), 0, 2,
                "the allgather of reduced chunks", set()),
    "lanes": (Pattern.SUMMABLE, "qsgd:levels=4", 3, 4096, 2, 1, at(Kind.LANES, 1, flip(17, 7)), 1, None,
              "the summed lanes of the Sum-allreduce of lanes fail their checksum", set()),
    "piece": (Pattern.HIERARCHICAL, "orq:levels=5", 4, 3000, 6, 2, at(Kind.HIER, 1, flip(10, 5), 1), 1, 0,
              "the fp32 piece rank 0 sent in hierarchical phase h1 fails its CRC-32", {0, 2, 3}),  # its host sum
    "cross": (Pattern.HIERARCHICAL, "orq:levels=5", 4, 3000, 7, 2, at(Kind.HIER, 3, flip(-9, 2), 2), 3, 3,
              "hierarchical phase h2 fails its CRC-32", {2}),  # its piece's sum, to its host
}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_one_verdict_a_step_stops_every_rank_naming_the_same(case: str) -> None:
    """No rank raises inside the step (no collective a tensor compares findings): the finder has
    its finding in its record and zeros in place of what it could not read; the other ranks have
    the exact sum, except where the finder passed its zeros on (a scatter owner's reduced chunk,
    a hierarchical owner's piece: what they apply at this step). The step's one verdict then
    stops every rank with the same error a verdict round a tensor gives, naming the tensor, its
    step, the finder and the sender."""
    pattern, spec, w, n, seed, local, corrupt, finder, sender, words, forwarded = STEP_CASES[case]
    xs = grads(w, n, seed)
    verdicts = [Verdicts() for _ in range(w)]
    outs = run(spec, xs, pattern, corrupt, local=local, verdicts=verdicts)
    assert all(isinstance(o, torch.Tensor) for o in outs), outs
    codes = [v.current[""].code_of("t") for v in verdicts]
    assert [c != 0.0 for c in codes] == [r == finder for r in range(w)], codes
    clean = run(spec, xs, pattern, local=local)
    for r in set(range(w)) - {finder}:
        assert torch.equal(outs[r], clean[r]) == (r not in forwarded), (r, forwarded)
    text = every_rank_raised(settle_all(verdicts), finder, sender, words)
    assert "the rank that found it before applying this step, the others at their next step" in text, text
    # the finding a verdict round a tensor reports, with the step's tail
    assert text.split("; every")[0] == str(error_of(f"t (step {STEP})", [codes[finder]], w)).split("; every")[0]


def test_a_clean_step_asks_for_one_collective_fewer_a_tensor_and_its_verdict_passes() -> None:
    names: dict[str, list[str]] = {"tensor": [], "step": []}

    def spy(key: str) -> Corrupt:
        def seen(req: Any, rank: int, got: Any) -> Any:
            if rank == 0:
                names[key].append(req.name)
            return got
        return seen

    for pattern in (Pattern.GATHER, Pattern.SCATTER, Pattern.SUMMABLE):
        xs = grads(3, 3000, 1)
        verdicts = [Verdicts() for _ in range(3)]
        by_tensor = run("qsgd:levels=4", xs, pattern, spy("tensor"))
        by_step = run("qsgd:levels=4", xs, pattern, spy("step"), verdicts=verdicts)
        assert all(torch.equal(a, b) for a, b in zip(by_tensor, by_step))  # the same bits
        assert settle_all(verdicts) == [None, None, None]
    assert [n for n in names["tensor"] if n.startswith("hvd_gradq.c.")] == ["hvd_gradq.c.t"] * 3
    assert names["step"] == [n for n in names["tensor"] if not n.startswith("hvd_gradq.c.")]


def test_the_lowest_finder_wins_and_its_tensor_is_named() -> None:
    """Two tensors in one step, corruption found by rank 2 in one and by rank 1 in the other:
    every rank raises rank 1's finding, naming its tensor; the verdict's name is the same on
    every rank, differs from the next step's and carries the group's scope."""
    verdicts = [Verdicts() for _ in range(3)]
    xs = grads(3, 3000, 3)
    run("orq:levels=5", xs, Pattern.GATHER, at(Kind.GATHER, 2, in_payload(0, 90, 0x04), tensor="a.weight"),
        name="a.weight", verdicts=verdicts)
    run("orq:levels=5", xs, Pattern.GATHER, at(Kind.GATHER, 1, in_payload(0, 90, 0x04), tensor="b.bias"),
        name="b.bias", verdicts=verdicts)
    records = [v.close()[0] for v in verdicts]
    assert {r.name for r in records} == {"hvd_gradq.cs0.a.weight"}
    outs = drive([settle(r) for r in records], NUMPY)
    every_rank_raised(outs, finder=1, sender=0, words="the allgather of payloads", tensor="b.bias")
    names = []
    for _ in range(2):  # the next steps: clean; the names alternate, the same on every rank
        run("orq:levels=5", xs, Pattern.GATHER, name="a.weight", verdicts=verdicts)
        records = [v.close()[0] for v in verdicts]
        names.append({r.name for r in records})
        assert drive([settle(r) for r in records], NUMPY) == [None] * 3
    assert names == [{"hvd_gradq.cs1.a.weight"}, {"hvd_gradq.cs0.a.weight"}]
    elastic = Verdicts()  # another generation's scope: its own names
    elastic.record(core.Group(0, 3, "g2."), "a.weight", STEP)
    assert elastic.close()[0].name == "hvd_gradq.g2.cs0.a.weight"


def test_statistics_that_differ_stop_every_rank_within_the_step_too() -> None:
    """Statistics are compared in the lanes, so every rank knows in the step: with one verdict a
    step as with one a tensor, every rank raises there, before deciding on them."""
    for xs, corrupt in ((grads(3, 4096, seed=4), at(Kind.STATS, 2, flip(3, 24))),
                        ([x.clamp(-0.5, 0.5) for x in grads(3, 4096, seed=9)], at(Kind.STATS, 0, flip(0, 30)))):
        xs[1][5] = 0.75
        outs = run("qsgd:levels=4", xs, Pattern.SUMMABLE, corrupt, verdicts=[Verdicts() for _ in range(3)])
        assert {str(o) for o in outs} == {DIFFERENT_STATISTICS}, outs


def test_a_finder_left_alone_says_what_it_waited_for() -> None:
    """The last step: nobody reaches the barrier after the finder's verdict (the others ended
    normally), or nobody joins the verdict at all; the finder raises all the same, saying so."""
    verdicts = [Verdicts() for _ in range(3)]
    run("orq:levels=5", grads(3, 3000), Pattern.GATHER, at(Kind.GATHER, 1, in_payload(2, 100, 0x10)),
        verdicts=verdicts)
    record = verdicts[1].close()[0]
    for error, what in ((record.alone(2.5), "did not join this step's verdict within 2.5 s"),
                        (record.error(record.vector(), left_alone("reach their next step", 2.5)),
                         "did not reach their next step within 2.5 s"),
                        (record.alone(None), "had ended Horovod")):
        text = str(error)
        assert text.startswith(f"t (step {STEP}): data corrupted in transit, found by rank 1: the payload rank 2 sent"), \
            text
        assert f"the other ranks {what}" in text and "this was their last step" in text, text


# -- TensorFlow's codec (its host functions, run eagerly) ------------------------------------------


@pytest.mark.parametrize("pattern,kind,index,bit", [(Pattern.GATHER, Kind.GATHER, 500, 3),
                                                    (Pattern.SCATTER, Kind.ALLTOALL, 40, 0),
                                                    (Pattern.SUMMABLE, Kind.LANES, 17, 2)])
def test_tensorflows_codec_stops_every_rank_too(pattern: Pattern, kind: Kind, index: int, bit: int) -> None:
    tf = pytest.importorskip("tensorflow")
    from hvd_gradq.tensorflow.ops import TF
    from hvd_gradq.tensorflow.transport import GraphCodec

    def run_tf(corrupt: Corrupt | None) -> list[Any]:
        spec = "qsgd:levels=4" if pattern is Pattern.SUMMABLE else "orq:levels=5"
        gens = []
        for r, x in enumerate(grads(3, 3000, seed=8)):
            red = core.Reduction(hvd_gradq.parse(spec), SEED, r, None, None, TF)
            part = core.Part("t", STEP, core.Group(r, 3, ""), GraphCodec(3, f"t (step {STEP})", False))
            gen = phases(Choice(pattern, ""), red, part, tf.constant(x.numpy()), TF)
            gens.append(gen if corrupt is None else tampered(gen, r, corrupt))
        return drive(gens, TF)

    def change(a: Any) -> Any:
        a = a.numpy().copy()
        a[index] ^= a.dtype.type(1 << bit)
        return tf.constant(a)

    clean = run_tf(None)
    assert all(np.array_equal(c.numpy(), clean[0].numpy()) for c in clean)
    outs = run_tf(at(kind, 1, lambda a: change(a)))
    every_rank_raised(outs, finder=1, sender=None if pattern is Pattern.SUMMABLE else 0, words="fail")


# -- the lanes' checksum itself -------------------------------------------------------------------


def test_the_lane_checksum_survives_the_sum_and_catches_random_double_errors() -> None:
    from hvd_gradq.wire.integrity import CHECK_LANES, checked, with_check

    rng = np.random.default_rng(0)
    ranks = [rng.integers(0, 1 << 28, 5000, dtype=np.int64) for _ in range(4)]
    summed = sum(with_check(NUMPY, r) for r in ranks)
    lanes, ok = checked(NUMPY, summed)
    assert ok.tolist() == [1.0] and np.array_equal(lanes, sum(ranks)) and summed.shape == (5000 + CHECK_LANES,)
    missed = 0
    for _ in range(3000):  # two flipped bits anywhere, the check lanes included
        bad = summed.copy()
        for i, b in zip(rng.integers(0, bad.shape[0], 2), rng.integers(0, 31, 2)):
            bad[i] ^= 1 << int(b)
        if np.array_equal(bad, summed):
            continue
        missed += int(checked(NUMPY, bad)[1][0] == 1.0)
    assert missed == 0


def test_the_lane_checksum_is_the_same_in_every_namespace() -> None:
    from hvd_gradq.wire.integrity import with_check

    lanes = np.random.default_rng(1).integers(0, (1 << 31) - 1, 3001, dtype=np.int64)
    want = with_check(NUMPY, lanes)
    assert np.array_equal(with_check(CPU, torch.from_numpy(lanes)).numpy(), want)
    tf = pytest.importorskip("tensorflow")
    from hvd_gradq.tensorflow.ops import TF

    assert np.array_equal(with_check(TF, tf.constant(lanes)).numpy(), want)


def test_the_fast_check_of_a_received_payload_refuses_every_flipped_bit() -> None:
    """``intact`` (what ``verify`` runs on every payload of every step) checks only the magic,
    the length and the CRC-32: enough to refuse any flipped bit, and whatever it passes parses."""
    from hvd_gradq.wire.payload import intact

    p = hvd_gradq.quantize(np.random.default_rng(3).standard_normal(700).astype(np.float32), "orq:levels=5",
                           seed=1).to_array()
    buf = np.concatenate([p, p])
    assert intact(buf, 0) == p.shape[0] and intact(buf, p.shape[0]) == buf.shape[0]
    assert intact(buf[:-1], p.shape[0]) is None  # truncated
    for byte in range(p.shape[0]):
        for bit in (0, 5):
            bad = buf.copy()
            bad[byte] ^= 1 << bit
            assert intact(bad, 0) is None, (byte, bit)


def test_summed_digests_tell_every_rank_whether_the_statistics_differ() -> None:
    """Each rank's digest of the statistics it received rides in its lanes; the summed digest
    lanes are ``size`` times each rank's own only where every rank received the same."""
    from hvd_gradq.wire.integrity import digest, digest_lanes, digests_agree

    stats = np.random.default_rng(2).standard_normal(40).astype(np.float32)
    other = stats.copy()
    other.view(np.int32)[7] ^= 1 << 12
    lanes = np.arange(10, dtype=np.int64)
    for received in ([stats] * 4, [stats, stats, other, stats]):
        ds = [digest(r) for r in received]
        summed = sum(np.concatenate([lanes, digest_lanes(NUMPY, d)]) for d in ds)
        same = all(np.array_equal(r, stats) for r in received)
        for d in ds:
            for ops, wrap in ((NUMPY, np.asarray), (CPU, torch.from_numpy)):
                back, agree = digests_agree(ops, wrap(summed), wrap(d), 4)
                assert np.array_equal(np.asarray(back), 4 * lanes) and float(agree[0]) == float(same)


def test_the_finders_bound_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from hvd_gradq.reduce import verdicts

    monkeypatch.delenv(verdicts.TIMEOUT_ENV, raising=False)
    assert verdicts.timeout() == verdicts.DEFAULT_TIMEOUT == 60.0
    monkeypatch.setenv(verdicts.TIMEOUT_ENV, "2.5")
    assert verdicts.timeout() == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        monkeypatch.setenv(verdicts.TIMEOUT_ENV, bad)
        with pytest.raises(hvd_gradq.GradqError, match=f"HVD_GRADQ_VERDICT_TIMEOUT='{bad}' is not valid: give the "
                                                        "seconds a rank that found corrupted data waits"):
            verdicts.timeout()


def test_a_finding_names_the_lowest_finder_and_round_trips() -> None:
    from hvd_gradq.reduce.integrity import Carrier, Phase, _parse, finding

    a = finding(3, Carrier.PAYLOAD, Phase.GATHER, 7)
    b = finding(12, Carrier.LANES, Phase.LANES)
    assert max(a, b) == a and float(np.float64(a)) == a
    assert _parse(a) == (3, Carrier.PAYLOAD, Phase.GATHER, 7)
    assert _parse(b) == (12, Carrier.LANES, Phase.LANES, None)
    assert _parse(finding(1_000_000, Carrier.PIECE, Phase.H4, 2_000_000)) == (1_000_000, Carrier.PIECE, Phase.H4,
                                                                            2_000_000)
