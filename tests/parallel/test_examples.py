"""The MNIST-1D examples under horovodrun: a short ORQ-5 run on 2 ranks ends with a sane summary
(accuracy above chance, bytes sent more than 4x below fp32, timings present)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import ROOT, HangError, LaunchError, horovodrun

pytestmark = pytest.mark.parallel

STEPS = 20
CHANCE = 0.10  # 10 classes, balanced test set


def run_example(script: str, spec: str, tmp: Path, timeout: float) -> dict:
    out = tmp / "summary.json"
    cmd = [horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(ROOT / "examples" / script),
           "--compression", spec, "--epochs", "1", "--max-steps", str(STEPS), "--quiet", "--json", str(out)]
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
    })
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # horovodrun stops its ranks on SIGTERM
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        raise HangError(f"{script} did not finish in {timeout:.0f} s.\n--- output ---\n{output[-6000:]}") from None
    if proc.returncode != 0 or not out.exists():
        raise LaunchError(f"{script} exited with {proc.returncode} after {time.monotonic() - t0:.0f} s.\n"
                          f"--- output ---\n{output[-8000:]}")
    summary = json.loads(out.read_text())
    assert "test accuracy" in output, output[-3000:]  # rank 0 printed its summary
    return summary


def check(s: dict, spec: str) -> None:
    assert s["compression"] == spec and s["ranks"] == 2 and s["steps"] == STEPS
    assert s["test_accuracy"] > CHANCE + 0.05, f"accuracy {s['test_accuracy']:.3f} is not above chance"
    assert s["bytes_source"] == "compressor.stats()"
    assert s["bytes_sent"] > 0 and s["ratio_vs_fp32"] > 4, s
    assert abs(s["bytes_fp32"] / s["bytes_sent"] - s["ratio_vs_fp32"]) < 1e-6 * s["ratio_vs_fp32"]
    assert 0 < s["step_time_s"] < 30 and s["timed_steps"] == STEPS - 5
    assert 0 < s["compress_share"] <= 1.0 + 1e-6, s["compress_share"]


def test_torch_example_orq5(tmp_path: Path) -> None:
    check(run_example("torch_mnist1d.py", "orq:levels=5", tmp_path, timeout=240), "orq:levels=5")


def test_keras_example_orq5(tmp_path: Path) -> None:
    pytest.importorskip("hvd_gradq.tensorflow")
    check(run_example("keras_mnist1d.py", "orq:levels=5", tmp_path, timeout=300), "orq:levels=5")
