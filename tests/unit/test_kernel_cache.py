"""The kernels' numba cache (hvd_gradq/kernels/_cache.py, _nb_cache.py): where it goes, dropped
when any kernel source changes (numba alone would keep a caller's cached code with an old callee
from another file), and one log line for each kernel compiled rather than loaded.

The place is checked against the documented order of choices, with the package folder made
unwritable by putting a file where its ``__pycache__`` would be (permissions would not stop root).
The log line is checked in fresh processes against an empty cache directory: the first process
compiles and says so, the second loads and says nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvd_gradq.kernels import _cache

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def fake_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A kernels folder of one source file, no cache variables set, the choice made afresh."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(_cache, "_HERE", pkg)
    for var in (_cache.ENV, "NUMBA_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _cache.cache_dir.cache_clear()
    yield pkg
    _cache.cache_dir.cache_clear()


def _read_only(pkg: Path) -> None:
    (pkg / "__pycache__").write_text("not a directory")  # nothing can be made or written there


def test_the_package_folder_when_writable(fake_kernels: Path) -> None:
    assert _cache.cache_dir() == fake_kernels / "__pycache__"


def test_a_read_only_package_caches_in_the_users_cache_folder(fake_kernels: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _read_only(fake_kernels)
    got = _cache.cache_dir()
    assert got.parent == tmp_path / "home" / ".cache" / "hvd_gradq" / "numba"
    assert got.name.startswith("kernels_")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _cache.cache_dir.cache_clear()
    assert _cache.cache_dir().parent == tmp_path / "xdg" / "hvd_gradq" / "numba"


def test_the_variables_come_first(fake_kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert _cache.cache_dir().parent == tmp_path / "numba"
    monkeypatch.setenv(_cache.ENV, str(tmp_path / "ours"))
    _cache.cache_dir.cache_clear()
    assert _cache.cache_dir().parent == tmp_path / "ours"


def test_two_installs_sharing_a_folder_get_their_own_subfolders(fake_kernels: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_cache.ENV, str(tmp_path / "shared"))
    first = _cache.cache_dir()
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(_cache, "_HERE", other)
    _cache.cache_dir.cache_clear()
    assert _cache.cache_dir() != first and _cache.cache_dir().parent == first.parent


def test_cached_kernels_survive_while_the_sources_stand(fake_kernels: Path) -> None:
    _cache.refresh()
    entry = fake_kernels / "__pycache__" / "a.f-1.py311.nbi"
    entry.write_text("index")
    _cache.refresh()
    assert entry.exists()


@pytest.mark.parametrize("where", ["package", "user"])
def test_a_changed_source_drops_every_cached_kernel(fake_kernels: Path, where: str) -> None:
    if where == "user":
        _read_only(fake_kernels)
    cache = _cache.cache_dir()
    _cache.refresh()
    cached = [cache / n for n in ("a.f-1.py311.nbi", "a.f-1.py311.1.nbc")]
    for f in cached:
        f.write_text("old")
    other = cache / "a.cpython-311.pyc"
    other.write_text("bytecode")
    (fake_kernels / "b.py").write_text("y = 2\n")  # a callee in another file changed
    _cache.refresh()
    assert not any(f.exists() for f in cached)
    assert other.exists()  # only numba's files go
    assert (cache / _cache._STAMP).read_text() == _cache.sources_hash()


def test_nowhere_writable_is_left_alone(fake_kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(_cache.ENV, str(blocker))  # a file: no folder can be made under it
    _cache.refresh()  # no exception: numba then compiles in every process


def test_the_locator_answers_for_the_kernels_only() -> None:
    from numba.core import caching  # a declared dependency

    from hvd_gradq.kernels import _nb_cache, _nb_common

    def elsewhere() -> None:
        pass

    locator = _nb_cache.LOCATOR
    assert locator is not None and caching.CacheImpl._locator_classes[0] is locator
    assert locator.from_function(elsewhere, __file__) is None  # type: ignore[attr-defined]
    kernel = _nb_common._maxabs.py_func
    loc = locator.from_function(kernel, kernel.__code__.co_filename)  # type: ignore[attr-defined]
    assert loc is not None and Path(loc.get_cache_path()) == _cache.cache_dir()
    assert Path(_nb_common._maxabs.stats.cache_path) == _cache.cache_dir()  # what numba itself uses


FIRST_STEP = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
import numpy as np, hvd_gradq
x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
hvd_gradq.dequantize(hvd_gradq.quantize(x, "fp16"))
"""


def test_a_compile_logs_one_line_and_a_cache_hit_none(tmp_path: Path) -> None:
    env = {**os.environ, _cache.ENV: str(tmp_path / "cache"), "HVD_GRADQ_KERNELS": "1"}
    runs = [subprocess.run([sys.executable, "-c", FIRST_STEP], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    lines = [ln for ln in runs[0].stdout.splitlines() if ln.startswith("hvd_gradq.kernels")]
    assert len(lines) == 1, runs[0].stdout
    assert "INFO compiled kernel _nb_common._maxabs in " in lines[0] and str(tmp_path / "cache") in lines[0]
    assert list((tmp_path / "cache").rglob("_nb_common._maxabs-*.nbi"))
    assert "hvd_gradq.kernels" not in runs[1].stdout, runs[1].stdout


WITHOUT_NUMBA = """
import sys, warnings
sys.modules["numba"] = None  # as if it were not installed: importing it raises ImportError
import numpy as np, hvd_gradq
from hvd_gradq.cli import main
x = np.random.default_rng(0).standard_normal(2048).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        hvd_gradq.dequantize(hvd_gradq.quantize(x, "orq:levels=3"))
print("WARNINGS", len(caught), [f"{w.category.__name__}: {w.message}" for w in caught])
print("WARM", main(["warm"]))
"""


def test_without_numba_a_warning_names_the_fix_and_warm_refuses() -> None:
    r = subprocess.run([sys.executable, "-c", WITHOUT_NUMBA], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "WARNINGS 1 ['RuntimeWarning: numba cannot be imported" in r.stdout, r.stdout
    assert "pip install numba" in r.stdout and "WARM 2" in r.stdout
    assert "numba is not installed" in r.stderr and "pip install numba" in r.stderr
