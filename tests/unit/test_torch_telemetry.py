"""What each tensor's reduction added after backward, as PyTorch's telemetry reads it from the
order of Horovod's calls (hvd_gradq.torch.telemetry): every compress() of a step, then one
decompress() a tensor as its reduction is waited for. A scripted clock is the oracle."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("horovod.torch")

from hvd_gradq.reduce.stats import Stats
from hvd_gradq.torch import telemetry as tm


def test_each_tensor_adds_the_time_from_the_previous_ones_end_or_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 0.0}
    monkeypatch.setattr(tm.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(tm, "hvd", SimpleNamespace(rank=lambda: 0))
    steps: list[dict[str, float]] = []
    t = tm.Telemetry(Stats(), lambda: {}, 0, lambda s: steps.append(dict(s)))

    def call(at: float, f: Any, *args: Any) -> None:
        clock["now"] = at
        f(at, *args)

    for base in (0.0, 10.0):  # two steps: the second's figures do not carry the first's
        t.begin_step()
        call(base + 0.10, t.compressed, None)  # hooks fire as backward runs
        call(base + 0.30, t.compressed, None)
        call(base + 0.50, t.compressed, None)  # backward ends here
        call(base + 0.45, t.decompressed, None, "w0")  # done before backward ended: it hid behind it
        call(base + 0.70, t.decompressed, None, "w1")  # waited 0.2 s after backward
        call(base + 0.75, t.decompressed, None, "w2")  # 0.05 s after w1's end
    assert len(steps) == 2
    for s in steps:
        assert s["w1"] == pytest.approx(0.20) and s["w2"] == pytest.approx(0.05)
        assert s["w0"] == 0.0  # nothing added after backward
