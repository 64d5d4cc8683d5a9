"""What a job's first step no longer does (issue 35, item 3): time the CPU figures at every start
(they are kept per machine beside the kernel cache: frontend/figure_cache.py, probe.kept) and load
the kernels in the step itself (a thread loads them when the compressor is built:
frontend/prefetch.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hvd_gradq.frontend import figure_cache, prefetch, probe
from hvd_gradq.kernels import parallel
from hvd_gradq.plan.cpu_cost import CAST, TABLE_ENV, Figures
from hvd_gradq.spec import parse_scheme

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kept_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kept figures in a file of this test's own; the default source (kept)."""
    f = tmp_path / figure_cache.FILE
    monkeypatch.setattr(figure_cache, "path", lambda: f)
    monkeypatch.delenv(probe.FIGURES_ENV, raising=False)
    monkeypatch.delenv(TABLE_ENV, raising=False)
    return f


class Timer:
    """A ``probe.measure`` stand-in that records what it was asked to time; each call's figures
    are larger than the last's, so a figure read back can be told from one timed again."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, schemes: list[Any], cast: Any = None, elements: int = probe.ELEMENTS,
                 reps: int = probe.REPS) -> Figures:
        self.asked.append([s.spec for s in schemes] + (["cast"] if cast is not None else []))
        k = float(len(self.asked))
        return Figures(tuple((s.spec, 10.0 * k, k) for s in schemes) + (((CAST, 0.5, 0.5),) if cast else ()))


def agreed(spec: str) -> Figures:
    return probe.agreed(parse_scheme(spec), 4, 1, lambda x: x, lambda row: np.stack([row, row]))


def test_kept_figures_are_timed_once_a_machine_and_read_back(kept_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = Timer()
    monkeypatch.setattr(probe, "measure", timer)
    assert probe.figures_source() == "kept"
    orq = [s.spec for s in probe.schemes_for(parse_scheme("orq:levels=5"), 4, 1)]
    first = agreed("orq:levels=5")
    assert timer.asked == [orq, ["cast"]]  # the schemes once, then the cast (never kept: the frontend's own)
    second = agreed("orq:levels=5")
    assert timer.asked[2:] == [["cast"]] and second == first  # read back, not timed again
    # another scheme sharing the finer second-phase one: only what the file lacks is timed
    uni = [s.spec for s in probe.schemes_for(parse_scheme("uniform:bits=4"), 4, 1)]
    agreed("uniform:bits=4")
    assert timer.asked[3] == [s for s in uni if s not in orq] and timer.asked[4] == ["cast"]
    body = json.loads(kept_file.read_text())
    assert body["format"] == figure_cache.FORMAT and set(body["figures"]) == {figure_cache.key(probe.ELEMENTS,
                                                                                               probe.REPS)}
    monkeypatch.setenv(probe.FIGURES_ENV, "measure")  # times every start, keeps nothing
    agreed("orq:levels=5")
    assert timer.asked[5] == [*orq, "cast"] and json.loads(kept_file.read_text()) == body


def test_kept_figures_belong_to_their_kernels_threads_and_machine(kept_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    figure_cache.store({"orq": (20.0, 1.0)}, probe.ELEMENTS, probe.REPS)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {"orq": (20.0, 1.0)}
    assert figure_cache.read(1024, probe.REPS) == {}  # another probe
    threads = parallel.resolve()
    monkeypatch.setattr(parallel, "_configured", threads + 1)  # the codec splits over more threads
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {}
    figure_cache.store({"orq": (12.0, 1.0)}, probe.ELEMENTS, probe.REPS)
    monkeypatch.setattr(parallel, "_configured", threads)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {"orq": (20.0, 1.0)}  # both keys kept
    # the smaller of two timings is kept (a busy machine only makes one longer)
    figure_cache.store({"orq": (25.0, 0.5)}, probe.ELEMENTS, probe.REPS)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {"orq": (20.0, 0.5)}
    # figures of other kernel sources are not read, and are dropped at the next write
    monkeypatch.setattr(figure_cache, "_sources", lambda: "other kernels")
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {}
    figure_cache.store({"sign": (1.0, 1.0)}, probe.ELEMENTS, probe.REPS)
    assert len(json.loads(kept_file.read_text())["figures"]) == 1


@pytest.mark.parametrize("text", ["not json", json.dumps({"format": "something else", "figures": {}}),
                                  json.dumps([1, 2]), "{\"format\": \"hvd_gradq cpu figures 1\", \"figures\": 3}"])
def test_a_file_that_is_not_kept_figures_counts_as_empty_and_is_replaced(kept_file: Path, text: str) -> None:
    kept_file.write_text(text)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {}
    figure_cache.store({"orq": (20.0, 1.0)}, probe.ELEMENTS, probe.REPS)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {"orq": (20.0, 1.0)}


def test_a_bad_kept_figure_is_timed_again(kept_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = Timer()
    monkeypatch.setattr(probe, "measure", timer)
    specs = [s.spec for s in probe.schemes_for(parse_scheme("sign"), 4, 1)]
    body = {"format": figure_cache.FORMAT, "kernels": figure_cache._sources(),
            "figures": {figure_cache.key(probe.ELEMENTS, probe.REPS): {s: [-1.0, "fast"] for s in specs}}}
    kept_file.write_text(json.dumps(body))
    got = agreed("sign")
    assert timer.asked[0] == specs and all(e > 0 for _, e, _ in got.ns)


def test_a_folder_that_cannot_be_written_keeps_nothing_and_fails_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setattr(figure_cache, "path", lambda: blocker / figure_cache.FILE)  # its folder is a file
    figure_cache.store({"orq": (20.0, 1.0)}, probe.ELEMENTS, probe.REPS)
    assert figure_cache.read(probe.ELEMENTS, probe.REPS) == {}


def test_prefetch_is_wanted_where_a_kernel_will_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HVD_GRADQ_KERNELS", raising=False)
    none, orq, fp16 = (parse_scheme(s) for s in ("none", "orq", "fp16"))
    assert not prefetch.wanted(none, priced=True)  # auto sends every tensor of none as Horovod's fp32
    assert prefetch.wanted(none, priced=False) and prefetch.wanted(orq, True) and prefetch.wanted(fp16, True)
    monkeypatch.setenv("HVD_GRADQ_KERNELS", "0")
    assert not prefetch.wanted(orq, priced=True)


_CHILD = r"""
import sys
from hvd_gradq.frontend import prefetch
from hvd_gradq.spec import parse_scheme
assert prefetch.start([parse_scheme("none")], priced=True) is None
assert "numba" not in sys.modules  # nothing to load: not even numba
t = prefetch.start([parse_scheme("uniform:bits=4")])
assert t is not None and t.daemon and prefetch.start([parse_scheme("uniform:bits=4")]) is None
prefetch.settle()
assert not t.is_alive()
from hvd_gradq.kernels import _nb_common, _nb_even
print(len(_nb_even.even_encode.signatures), len(_nb_even.even_decode.signatures), len(_nb_common._maxabs.signatures))
import os
t = prefetch.start([parse_scheme("sign")])
pid = os.fork()  # waits for the loading thread first: a child inherits no lock of it
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
assert t is not None and not t.is_alive()
"""


def test_prefetch_loads_a_schemes_kernels_on_a_thread_in_a_fresh_process() -> None:
    """In a process of its own (this one has run kernels already): ``none`` under the cost model
    loads nothing, not even numba; uniform's thread loads its encoder, decoder and the scan, and
    is started once; a fork() waits for a loading thread."""
    pytest.importorskip("numba")
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = [int(v) for v in out.stdout.split()]  # signatures of the encoder, the decoder, the scan
    assert len(loaded) == 3 and min(loaded) >= 1, out.stdout
