"""hvd_gradq/frontend/workers.py: the pool that encodes and decodes off the training thread."""
from __future__ import annotations

import threading
import time

import pytest

from hvd_gradq import GradqError
from hvd_gradq.frontend import workers
from hvd_gradq.frontend.workers import Workers, check_threads, resolve_threads, wait


def test_inline_runs_now_and_keeps_the_exception_for_result() -> None:
    w = Workers(0)
    seen = []
    f = w.submit(lambda: seen.append(threading.get_ident()) or 7)
    assert f.done() and f.result() == 7 and seen == [threading.get_ident()]

    def boom() -> None:
        raise ValueError("bad gradient")

    g = w.submit(boom)
    assert g.done()
    with pytest.raises(ValueError, match="bad gradient"):
        g.result()


def test_a_pool_runs_jobs_off_the_calling_thread_in_order() -> None:
    w = Workers(1)
    order: list[int] = []
    gate = threading.Event()
    first = w.submit(lambda: (gate.wait(5), order.append(0), threading.get_ident())[-1])
    later = [w.submit(lambda i=i: order.append(i)) for i in range(1, 5)]
    assert not first.done()  # it waits on the gate: the caller was not blocked
    gate.set()
    assert first.result(5) != threading.get_ident()
    for f in later:
        f.result(5)
    assert order == [0, 1, 2, 3, 4]
    w.close()


def test_thread_counts_are_checked_with_a_way_out() -> None:
    assert check_threads("3", "X") == 3 and check_threads(0, "X") == 0
    for bad in (-1, 65, 2.0, True, "two", None):
        with pytest.raises(GradqError, match=r"0 \(inline\) \.\. 64"):
            check_threads(bad, "threads=")


def test_the_argument_beats_the_environment_beats_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "cores", lambda: 8)
    monkeypatch.delenv(workers.ENV, raising=False)
    assert resolve_threads(None, 2) == 4  # 4 cores a rank: all of them for the codec
    assert resolve_threads(None, 8) == 0  # one core a rank: inline, never competing with training
    monkeypatch.setenv(workers.ENV, "3")
    assert resolve_threads(None, 8) == 3
    assert resolve_threads(0, 8) == 0
    monkeypatch.setenv(workers.ENV, "lots")
    with pytest.raises(GradqError, match="HVD_GRADQ_THREADS"):
        resolve_threads(None, 1)


def test_wait_polls_until_done() -> None:
    t0 = time.monotonic()
    wait(lambda: time.monotonic() - t0 > 0.05)
    assert time.monotonic() - t0 >= 0.05
