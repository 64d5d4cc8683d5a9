"""The link rate measured at the handshake (hvd_gradq.frontend.link), on a simulated network
whose rate and latency the test sets: the measurement must find the rate of the slowest rank's
link, whatever the fixed cost of a call, and every rank must run the same collectives."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hvd_gradq.frontend import link


class Network:
    """Ranks on a ring of ``gbps`` links: an allgather of B-byte payloads over ``nranks`` ranks
    takes ``latency`` + (nranks - 1) * B * 8 / rate on a clock the test owns; ``peers``: the
    other ranks' agreed times, which the last call (the times) gathers with this rank's."""

    def __init__(self, nranks: int, gbps: float, latency: float, peers: list[list[float]]) -> None:
        self.nranks, self.gbps, self.latency, self.peers = nranks, gbps, latency, peers
        self.now = 0.0
        self.sizes: list[int] = []
        self.sent: list[float] = []  # this rank's best times, as it handed them to the agreement

    def clock(self) -> float:
        return self.now

    def allgather(self, row: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        self.sizes.append(row.nbytes)
        if row.size == 2 and row.nbytes < link.SMALL:  # the agreement on times
            self.sent = [float(v) for v in row]
            return np.concatenate([row] + [np.array(p) for p in self.peers])
        self.now += self.latency + (self.nranks - 1) * row.nbytes * 8 / (self.gbps * 1e9)
        return np.concatenate([row] * self.nranks)


def took(nranks: int, gbps: float, latency: float, size: int) -> float:
    return latency + (nranks - 1) * size * 8 / (gbps * 1e9)


@pytest.mark.parametrize("nranks, gbps, latency", [(2, 1.0, 0.0), (2, 0.1, 2e-3), (4, 25.0, 5e-4), (8, 10.0, 1e-3)])
def test_the_rate_of_a_simulated_link_is_found_whatever_its_latency(nranks: int, gbps: float, latency: float) -> None:
    net = Network(nranks, gbps, latency, peers=[])
    got = link.measure(net.allgather, nranks, clock=net.clock)
    assert got.gbps == pytest.approx(gbps, rel=1e-9)
    assert got.small_s == pytest.approx(took(nranks, gbps, latency, link.SMALL), rel=1e-9)
    assert got.large_s == pytest.approx(took(nranks, gbps, latency, link.LARGE), rel=1e-9)
    # every rank runs these collectives, in this order: an untimed call of each size, then REPS timed
    each = link.REPS + 1
    assert net.sizes == [link.SMALL] * each + [link.LARGE] * each + [16]


def test_the_slowest_rank_decides_and_every_rank_computes_the_same_rate() -> None:
    # two ranks, one behind a 0.5 Gbit/s link: each first alone, to learn what it sends the other
    rows = []
    for gbps in (1.0, 0.5):
        alone = Network(2, gbps, 1e-3, peers=[])
        link.measure(alone.allgather, 2, clock=alone.clock)
        rows.append(alone.sent)
    a, b = Network(2, 1.0, 1e-3, peers=[rows[1]]), Network(2, 0.5, 1e-3, peers=[rows[0]])
    ra, rb = link.measure(a.allgather, 2, clock=a.clock), link.measure(b.allgather, 2, clock=b.clock)
    assert ra == rb  # the same agreed numbers: the same rate, bit for bit
    assert ra.gbps == pytest.approx(0.5, rel=1e-9)


def test_a_preempted_call_does_not_make_the_link_look_slower() -> None:
    net = Network(2, 1.0, 1e-3, peers=[])
    calls = {"n": 0}

    def noisy(row: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        calls["n"] += 1
        if calls["n"] in (2, 6):  # the first timed call of each size is preempted for 50 ms
            net.now += 0.05
        return net.allgather(row)

    assert link.measure(noisy, 2, clock=net.clock).gbps == pytest.approx(1.0, rel=1e-9)


def test_a_difference_below_the_clocks_resolution_reads_as_the_fastest_rate() -> None:
    assert link.rate(2, 1e-3, 1e-3) == link.FASTEST
    assert link.rate(2, 1e-3, 0.5e-3) == link.FASTEST
    assert link.rate(2, 0.0, 1e6) == link.SLOWEST  # clamped, never zero: the model divides by it
    got = link.Link(0.94, 2e-4, 9e-3).describe()
    assert got.startswith("measured: 0.94 Gbit/s") and "1024 KiB" in got and "9.00 ms" in got
