"""Launch an elastic Horovod job (``horovodrun`` with a host-discovery script) from pytest, under a
hard timeout of its own: the process group is killed when it runs over, and the test fails as a
hang. Shared by the project's elastic tests and the compatibility suite's driver."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
from harness import ROOT, HangError, horovodrun

RUN_TOKEN = "HVD_GRADQ_ELASTIC_RUN"  # in every process a run starts: how _kill finds them


def discovery_script(path: Path, epochs_log: Path, schedule: list[str]) -> Path:
    """A discovery script printing ``schedule[k]`` (hosts, comma-separated) once ``epochs_log`` has
    ``k`` lines, the last entry from then on: the driver's view follows the job's epochs."""
    lines = ["#!/bin/bash", "n=0", f'[ -f "{epochs_log}" ] && n=$(wc -l < "{epochs_log}")']
    for k, hosts in enumerate(schedule):
        echo = "; ".join(f'echo "{h}"' for h in hosts.split(","))
        if k == len(schedule) - 1:
            lines.append(f"{echo}" if k == 0 else f"else {echo}; fi")
        else:
            lines.append(f'{"if" if k == 0 else "elif"} [ "$n" -le {k} ]; then {echo}')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def worker_parser() -> argparse.ArgumentParser:
    """The options every elastic worker of these tests takes (its own are added to it)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs-log", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--kill-at", default="1,2")
    parser.add_argument("--grow-after", type=int, default=0, help="the epoch after which a host is added")
    return parser


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The workers' environment: the repository and tests on the path, Gloo's patience for a loaded
    machine, one thread a rank."""
    e = dict(os.environ)
    e.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent), e.get("PYTHONPATH", "")]),
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
    })
    e.update(extra or {})
    return e


def run(cmd: list[str], timeout: float, cwd: Path = ROOT, extra_env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` and return it finished; HangError after ``timeout``. Horovod's elastic driver
    starts each worker in a process group of its own, so the group of ``cmd`` is not enough: every
    process carrying this run's token in its environment is killed at the end (a hang's workers,
    and those of a failed world that outlive the driver)."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, cwd=cwd, env=env({**(extra_env or {}), RUN_TOKEN: token}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException as e:  # a timeout, or pytest stopping: no orphans
        _kill(token, proc.pid)
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        out, _ = proc.communicate()
        raise HangError(f"{' '.join(cmd[:6])}... did not finish in {timeout:.0f} s and was killed: a hang.\n"
                        f"--- output ---\n{out[-8000:]}") from None
    _kill(token, proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _kill(token: str, pid: int) -> None:
    """SIGKILL ``pid``'s group and every process whose environment holds ``token``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(RUN_TOKEN) == token:
                p.kill()
        except (psutil.Error, OSError):
            continue


def elastic_cmd(script: Path, discovery: Path, np: int, min_np: int, max_np: int, args: list[str]) -> list[str]:
    return [horovodrun(), "--gloo", "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", str(discovery), "--network-interface", "lo",
            sys.executable, str(script), *args]
