"""bench/models/bench_models.py --quick: the model benchmark's whole path in one short launch
(``horovodrun --gloo -np 2`` on loopback, ResNet-18-like at 32x32, batch 2, one warm-up and one
timed step each for Horovod fp16 and BinGrad): the driver's report and raw results, every rank
bitwise equal per compression, the model's real size. Seconds of training; the rest is start-up."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, HangError, LaunchError

pytestmark = pytest.mark.parallel

DRIVER = ROOT / "bench" / "models" / "bench_models.py"
LAUNCH_TIMEOUT = 150  # the driver's own limit on the horovodrun launch
TIMEOUT = 200  # this test's, on top of the driver's start and report


@pytest.mark.timeout(TIMEOUT + 30)
def test_quick_run_reports_both_compressions_with_equal_ranks(tmp_path: Path) -> None:
    cmd = [sys.executable, str(DRIVER), "--quick", "--timeout", str(LAUNCH_TIMEOUT),
           "--out", str(tmp_path / "quick.md"), "--raw", str(tmp_path)]
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), "TF_CPP_MIN_LOG_LEVEL": "2",
                # as the suite's other launches: the shipped cost figures, no timing at the first step
                "HVD_GRADQ_FIGURES": "table", "HOROVOD_GLOO_TIMEOUT_SECONDS": "180",
                # BinGrad's own bytes are checked: auto keeps the model's plan (no trial of plans,
                # which would also run its tens of steps first: test_torch_trial.py tests it)
                "HVD_GRADQ_FALLBACK": "0"})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the driver kills its horovodrun on SIGTERM
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise HangError(f"bench_models.py --quick did not finish in {TIMEOUT} s\n{out[-6000:]}") from None
    if proc.returncode != 0:
        log = tmp_path / "models_quick.log"
        raise LaunchError(f"bench_models.py --quick exited with {proc.returncode}\n{out[-4000:]}\n--- log ---\n"
                          f"{log.read_text()[-6000:] if log.exists() else ''}")
    assert "[1/1] resnet18 torch loopback, threads default" in out
    doc = json.loads((tmp_path / "models_quick.json").read_text())
    (run,) = doc["runs"]
    result = run["result"]
    assert (result["params"], result["tensors"], result["size"]) == (11_689_512, 62, 2)
    assert list(result["compressions"]) == ["fp16", "bingrad"]
    for spec, c in result["compressions"].items():
        assert c["ranks_equal"], spec
        assert len(c["block_s"]) == 1 and c["block_s"][0] > 0, spec
    assert result["compressions"]["bingrad"]["bytes_vs_fp32"] > 20  # one bit an element, plus levels
    report = (tmp_path / "quick.md").read_text()
    assert "| bingrad |" in report and "**NO**" not in report
