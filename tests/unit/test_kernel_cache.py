"""The kernels' numba cache is dropped when any kernel source changes (hvd_gradq/kernels/_cache.py):
numba alone would keep a caller's cached code with an old callee from another file."""
from __future__ import annotations

from pathlib import Path

import pytest

from hvd_gradq.kernels import _cache


@pytest.fixture()
def fake_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "__pycache__").mkdir()
    monkeypatch.setattr(_cache, "_HERE", tmp_path)
    return tmp_path


def test_cached_kernels_survive_while_the_sources_stand(fake_kernels: Path) -> None:
    _cache.refresh()
    entry = fake_kernels / "__pycache__" / "a.f-1.py311.nbi"
    entry.write_text("index")
    _cache.refresh()
    assert entry.exists()


def test_a_changed_source_drops_every_cached_kernel(fake_kernels: Path) -> None:
    _cache.refresh()
    cached = [fake_kernels / "__pycache__" / n for n in ("a.f-1.py311.nbi", "a.f-1.py311.1.nbc")]
    for f in cached:
        f.write_text("old")
    other = fake_kernels / "__pycache__" / "a.cpython-311.pyc"
    other.write_text("bytecode")
    (fake_kernels / "b.py").write_text("y = 2\n")  # a callee in another file changed
    _cache.refresh()
    assert not any(f.exists() for f in cached)
    assert other.exists()  # only numba's files go
    assert (fake_kernels / "__pycache__" / _cache._STAMP).read_text() == _cache.sources_hash()


def test_an_unwritable_cache_is_left_alone(fake_kernels: Path) -> None:
    (fake_kernels / "__pycache__").rmdir()
    (fake_kernels / "__pycache__").write_text("not a directory")
    _cache.refresh()  # no exception: numba caches elsewhere or not at all
