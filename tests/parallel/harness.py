"""Launch a worker script under ``horovodrun`` from pytest, and read back what each rank wrote.

A worker calls :func:`report` with a JSON-able dict; the launching test gets ``{rank: dict}``.
A non-zero exit fails with every rank's output; a launch that outlives ``timeout`` is killed
(the whole process group) and fails as a hang, so CI never stalls.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT_ENV = "HVD_GRADQ_TEST_OUT"


class LaunchError(AssertionError):
    """A parallel launch failed: a rank exited non-zero or ranks disagree."""


class HangError(LaunchError):
    """A parallel launch did not finish in time."""


def horovodrun() -> str:
    cand = Path(sys.executable).parent / "horovodrun"
    return str(cand) if cand.exists() else "horovodrun"


def launch(
    script: str | Path,
    np: int = 2,
    controller: str = "gloo",
    args: list[str] | None = None,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    per_host: int = 0,
) -> dict[int, dict[str, Any]]:
    """Run ``script`` on ``np`` ranks with ``controller`` (gloo or mpi); return each rank's report.
    ``per_host`` > 0 makes Horovod see np/per_host hosts of that many ranks (:mod:`fake_hosts`, Gloo)."""
    if controller not in ("gloo", "mpi"):
        raise ValueError(f"controller must be gloo or mpi, not {controller!r}")
    script = Path(script)
    if not script.is_absolute():
        script = Path(__file__).parent / script
    with tempfile.TemporaryDirectory(prefix="hvdq-") as out:
        e = dict(os.environ)
        e.update(
            {
                OUT_ENV: out,
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent), e.get("PYTHONPATH", "")]),
                "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                # Gloo's 30 s default for one transfer is too short on a 2-core machine running a
                # suite while numba compiles on one rank; a real hang still ends at ``timeout``.
                "HOROVOD_GLOO_TIMEOUT_SECONDS": "180",
                # the workers check each pattern's arithmetic against oracles: auto's fp16 fallback
                # (a question of time, on figures each launch measures anew) is off unless a check
                # asks for it (fallback=True, or env=)
                "HVD_GRADQ_FALLBACK": "0",
                # and auto's choices among patterns come from the shipped table, the same in
                # every launch, not from timings that move with the machine's load
                "HVD_GRADQ_FIGURES": "table",
            }
        )
        if env:
            e.update(env)
        cmd = [horovodrun(), f"--{controller}", "-np", str(np), "-H", f"localhost:{np}"]
        if per_host:
            hosts = ",".join(f"h{i}:{per_host}" for i in range(np // per_host))
            cmd = [sys.executable, str(Path(__file__).parent / "fake_hosts.py"), "--gloo", "-np", str(np), "-H", hosts]
        cmd += [sys.executable, str(script)] + list(args or [])
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except BaseException as e:  # a timeout, or pytest itself stopping the test: no orphans
            os.killpg(proc.pid, signal.SIGKILL)
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            output, _ = proc.communicate()
            raise HangError(
                f"{script.name} on {np} ranks ({controller}) did not finish in {timeout:.0f} s "
                f"and was killed: a hang.\n--- output ---\n{output[-8000:]}"
            ) from None
        took = time.monotonic() - t0
        if proc.returncode != 0:
            raise LaunchError(
                f"{script.name} on {np} ranks ({controller}) exited with {proc.returncode} "
                f"after {took:.0f} s.\n--- output ---\n{output[-12000:]}"
            )
        reports: dict[int, dict[str, Any]] = {}
        for f in Path(out).glob("rank*.json"):
            reports[int(f.stem[4:])] = json.loads(f.read_text())
        missing = sorted(set(range(np)) - set(reports))
        if missing:
            raise LaunchError(f"{script.name}: ranks {missing} wrote no report.\n--- output ---\n{output[-8000:]}")
        for r in reports.values():
            r.setdefault("_output", output[-4000:])
        return reports


def report(rank: int, data: dict[str, Any]) -> None:
    """Called by a worker: record this rank's results for the launching test."""
    out = os.environ.get(OUT_ENV)
    if not out:
        print(json.dumps(data))
        return
    Path(out, f"rank{rank}.json").write_text(json.dumps(data))


def assert_ranks_equal(reports: dict[int, dict[str, Any]], key: str) -> None:
    """All ranks reported the same value under ``key``; else say which ranks differ from rank 0."""
    ref = reports[0][key]
    bad = [r for r in sorted(reports) if reports[r][key] != ref]
    if bad:
        detail = "\n".join(f"  rank {r}: {reports[r][key]!r}" for r in sorted(reports))
        raise LaunchError(f"ranks {bad} differ from rank 0 in {key!r}:\n{detail}")


def sections(only: set[str], out: dict[str, Any], rank: int) -> Any:
    """A worker's section decorator: ``@section("name")`` runs the function at once if ``only``
    is empty or names it, and stores its result, or its error as text (so that one broken
    section does not hide the others), under ``out[name]``."""

    def section(name: str) -> Any:
        def wrap(f: Any) -> Any:
            if only and name not in only:
                return f
            print(f"[{rank}] section {name}", flush=True)
            try:
                out[name] = f()
            except Exception as e:  # reported, checked by the test
                out[name] = {"error": f"{type(e).__name__}: {e}"[:3000], "trace": traceback.format_exc()[-3000:]}
            return f
        return wrap

    return section


def digest(arrays: Any) -> str:
    """SHA-256 of the bytes of a sequence of arrays (anything ``np.asarray`` takes)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.asarray(a).tobytes())
    return h.hexdigest()
