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

import pytest

from hvd_gradq.errors import GradqError
from hvd_gradq.frontend import versions

ROOT = Path(__file__).resolve().parents[2]


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
