"""The demo: one training job, with and without gradient compression, on a slow link.

    bash scripts/demo.sh                                  # set-up if needed, then this
    bash scripts/demo.sh --rate 100mbit                   # another link speed
    bash scripts/demo.sh --jobs fp32,orq,bingrad          # other jobs (fp32 fp16 orq orq3 bingrad)
    bash scripts/demo.sh --jobs "fp16;orq:levels=4,ef=true"  # any hvd_gradq spec as a job
    HVD_GRADQ_DEMO_LOOPBACK=1 bash scripts/demo.sh        # force the loopback fallback

The job is the quality study's MNIST-1D recipe (``bench/quality/study_tasks.py``): an MLP 40-300-300-10
(105,610 parameters, 422 kB of fp32 gradients a step), momentum SGD (lr 0.6, momentum 0.9,
Nesterov, weight decay 5e-4), global batch 256 (128 a rank), linear warm-up over 10% of the
steps then cosine, 300 steps, seed 0, 2 ranks. It runs ``bench/quality/train_mnist1d.py --model mlp``
once per compression: Horovod's fp32 allreduce (no compression), Horovod's own
``hvd.Compression.fp16``, hvd_gradq's ORQ with its defaults (``orq``, 5 levels: what
``gq.ORQ()`` builds) and ORQ-3 (``orq:levels=3``); ``--jobs`` adds BinGrad+EF.

Where it can, each job runs on an **emulated network**: ``bench/e2e/netbench.py`` puts each rank on
its own network namespace (2 hosts, 1 rank each) joined by veth links shaped by ``tc tbf`` to
``--rate`` each way, and reads the bytes that crossed each link from the kernel's counters.
The default, 20 Mbit/s, is chosen for this small model: fp32's 422 kB a step take ~177 ms of
that link, nearly all of its step, the regime compression is for. At 100 Mbit/s (~35 ms of wire
a step) the compressors' own CPU time decides instead: on 2 cores loaded by other work ORQ-5 ran
at 0.65x and 0.97x of fp32's speed in two runs, slower than Horovod's fp16
(``results/e2e/demo_100mbit.txt``; ``--rate 100mbit``). That needs
root (``os.geteuid() == 0``), ``netbench.py --check`` passing, and network namespaces that can
really be made (probed once). Otherwise, or with ``HVD_GRADQ_DEMO_LOOPBACK=1`` in the
environment, the demo says so and runs ``horovodrun -np 2 -H localhost:2 --gloo`` on loopback:
no link is shaped there and no bytes are counted on a wire, only what the compressor reports.

Rank 0's progress bar and summary show as each job runs; the table at the end compares them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.netemu.links import parse_rate  # noqa: E402 (the repository root is on sys.path)

NETBENCH = "bench/e2e/netbench.py"  # runs a script on the emulated hosts
TRAIN = "bench/quality/train_mnist1d.py"  # the measured MNIST-1D run

LOOPBACK_ENV = "HVD_GRADQ_DEMO_LOOPBACK"

#: shorthand -> (column title, spec for bench/quality/train_mnist1d.py --compression); any other --jobs entry is
#: an hvd_gradq spec (or stock-none / stock-fp16), titled by itself
JOBS = {
    "fp32": ("no compression", "stock-none"),
    "fp16": ("Horovod fp16", "stock-fp16"),
    "orq": ("ORQ-5 (gq.ORQ())", "orq"),
    "orq3": ("ORQ-3", "orq:levels=3"),
    "bingrad": ("BinGrad+EF", "bingrad:ef=true"),
}
DEFAULT_JOBS = "fp32,fp16,orq,orq3"
RANKS = 2
GLOBAL_BATCH = 256


@dataclass
class Result:
    title: str
    spec: str
    wall_s: float
    summary: dict[str, Any]
    link: Optional[dict[str, Any]] = None  # netbench's --json, when emulated


# -- can the network be emulated here? --------------------------------------------------------------
def emulation(rate: str) -> tuple[bool, str]:
    """(True, how) when namespaces and shaped links work here, else (False, why not)."""
    if os.environ.get(LOOPBACK_ENV, "") not in ("", "0"):
        return False, f"{LOOPBACK_ENV}={os.environ[LOOPBACK_ENV]} is set"
    if os.geteuid() != 0:
        return False, f"not root (euid {os.geteuid()}): network namespaces and tc need root"
    cp = subprocess.run([sys.executable, str(ROOT / NETBENCH), "--check"], capture_output=True, text=True,
                        cwd=ROOT, timeout=60)
    if cp.returncode != 0:
        return False, f"{NETBENCH} --check failed: " + (cp.stdout + cp.stderr).strip().replace("\n", "; ")
    try:
        from bench import netemu

        with netemu.EmulatedCluster(RANKS, rate=rate, lock_timeout=120):
            pass  # build and remove the namespaces once: root in a container may still lack CAP_NET_ADMIN
    except Exception as e:  # any failure means: fall back, and say why
        return False, f"could not build the emulated hosts ({type(e).__name__}: {e})"
    return True, f"netbench.py --check passed ({cp.stdout.strip().splitlines()[0]}); namespaces probed"


# -- one job ------------------------------------------------------------------------------------------
def train_args(a: argparse.Namespace, spec: str, out: Path) -> list[str]:
    return [TRAIN, "--model", "mlp", "--optimizer", "sgd", "--lr", str(a.lr),
            "--weight-decay", "5e-4", "--warmup-frac", "0.1", "--batch-size", str(GLOBAL_BATCH // RANKS),
            "--epochs", "1000", "--max-steps", str(a.steps), "--eval-every", str(a.eval_every), "--seed", str(a.seed),
            "--compression", spec, "--json", str(out)]


def command(a: argparse.Namespace, spec: str, out: Path, link_json: Path, emulated: bool) -> list[str]:
    py = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable
    if emulated:
        return [py, NETBENCH, "--hosts", str(RANKS), "--rate", a.rate, "--timeout", str(int(a.timeout)),
                "--json", str(link_json), "--", *train_args(a, spec, out)]
    hr = Path(sys.executable).parent / "horovodrun"
    hvdrun = os.path.relpath(hr, ROOT) if hr.exists() and str(hr).startswith(str(ROOT)) else "horovodrun"
    return [hvdrun, "-np", str(RANKS), "-H", f"localhost:{RANKS}", "--gloo", py, *train_args(a, spec, out)]


#: output lines of ranks other than 0 (netbench: "[h1] ", horovodrun: "[1]<stdout>:"), and phase marks
OTHER_RANK = re.compile(r"^(\[h[1-9]\d*\] |\[[1-9]\d*\]<(stdout|stderr)>:)")
QUIET = re.compile(r"NETBENCH_PHASE ")


STOCK = ("stock-none", "stock-fp16")


def parse_jobs(text: str) -> list[tuple[str, str]]:
    """``--jobs`` -> [(title, spec)]. Entries are separated by ``;`` or ``,``; a comma-separated piece
    that holds ``=`` but no ``:`` continues the spec before it, so ``fp32,orq:levels=5,ef=true,fp16``
    is three jobs. Each entry is a shorthand of :data:`JOBS`, ``stock-none``/``stock-fp16`` or an
    hvd_gradq spec (checked here, so a typo fails before any job runs). Raises ValueError."""
    entries: list[str] = []
    for part in text.split(";"):
        for piece in part.split(","):
            piece = piece.strip()
            if not piece:
                continue
            if "=" in piece and ":" not in piece and entries and ":" in entries[-1]:
                entries[-1] += "," + piece
            else:
                entries.append(piece)
    if not entries:
        raise ValueError("--jobs is empty")
    jobs = []
    for e in entries:
        if e in JOBS:
            jobs.append(JOBS[e])
        elif e in STOCK:
            jobs.append((e, e))
        else:
            from hvd_gradq import GradqError, parse

            try:
                parse(e)  # validated now; passed on as typed (the canonical form spells out every default)
            except GradqError as err:
                raise ValueError(f"--jobs entry {e!r} is neither a shorthand ({' '.join(JOBS)}), stock-none, "
                                 f"stock-fp16 nor a valid hvd_gradq spec: {err}") from None
            jobs.append((e, e))
    return jobs


def run_job(a: argparse.Namespace, index: int, title: str, spec: str, emulated: bool, tmp: Path) -> Result:
    out, link_json = tmp / f"job{index}.json", tmp / f"job{index}.link.json"
    cmd = command(a, spec, out, link_json, emulated)
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)})
    print(f"\n=== {title}: {spec}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    hidden: list[str] = []  # other ranks' lines: shown only if the job fails
    timer = threading.Timer(a.timeout + 60, stop, args=(proc,))
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if OTHER_RANK.match(line) or QUIET.search(line):
                hidden.append(line)
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        raise
    finally:
        timer.cancel()
    wall = time.monotonic() - t0
    if rc != 0 or not out.exists():
        sys.stdout.write("".join(hidden[-40:]))
        raise SystemExit(f"the {title} job failed (exit status {rc}) after {wall:.0f} s")
    link = json.loads(link_json.read_text()) if emulated and link_json.exists() else None
    return Result(title, spec, wall, json.loads(out.read_text()), link)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (netbench removes its namespaces, horovodrun stops its ranks), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


# -- the table ----------------------------------------------------------------------------------------
def link_bytes_per_step(link: dict[str, Any], steps: int) -> tuple[float, float]:
    """(bytes host 0 sent, bytes it received) per step between the phase marks around training."""
    marks = {m["name"]: m for m in link["marks"]}
    a, b = marks["train"], marks["trained"]
    return ((b["bytes_sent"][0] - a["bytes_sent"][0]) / steps, (b["bytes_recv"][0] - a["bytes_recv"][0]) / steps)


def time_to(curve: list[dict[str, float]], target: float) -> Optional[dict[str, float]]:
    return next((c for c in curve if 100 * c["accuracy"] >= target), None)


def kb(b: float) -> str:
    return f"{b / 1e3:.1f} kB"


def table(results: list[Result], target: float, emulated: bool) -> str:
    fp32 = next((r for r in results if r.spec == "stock-none"), None)

    def ttt(r: Result) -> str:
        hit = time_to(r.summary["curve"], target)
        if hit is None:
            best = max((c["accuracy"] for c in r.summary["curve"]), default=r.summary["test_accuracy"])
            return f"not reached (best {100 * best:.1f}%)"
        return f"{hit['train_s']:.1f} s (step {hit['step']:.0f})"

    def speed(r: Result) -> str:
        if fp32 is None or r is fp32:
            return "1.00x" if r is fp32 else "-"
        return f"{fp32.summary['step_time_s'] / r.summary['step_time_s']:.2f}x"

    def sent(r: Result) -> str:
        s = r.summary
        return f"{kb(s['bytes_sent'] / s['steps'])} (x{s['ratio_vs_fp32']:.1f} less)"

    rows: list[tuple[str, Any]] = [
        ("spec (--jobs entry)", lambda r: r.spec),
        ("final test accuracy", lambda r: f"{100 * r.summary['test_accuracy']:.1f}%"),
        (f"time to {target:g}% test accuracy", ttt),
        ("mean step time", lambda r: f"{1000 * r.summary['step_time_s']:.1f} ms"),
        ("step speed vs no compression", speed),
        ("  of which in the compressor", lambda r: f"{1000 * r.summary['compress_s_per_step']:.1f} ms"),
        ("bytes a rank sent / step", sent),
    ]
    if emulated:
        rows.append(("bytes on the link / step (h0 out)",
                     lambda r: kb(link_bytes_per_step(r.link, r.summary["steps"])[0]) if r.link else "n/a"))
    else:
        rows.append(("bytes on the link / step", lambda r: "n/a (loopback)"))
    rows.append(("total wall time of the job", lambda r: f"{r.wall_s:.0f} s"))
    cells = [[""] + [r.title for r in results]] + [[label] + [f(r) for r in results] for label, f in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for k, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rate", default="20mbit", help="tc rate of each emulated link, each way (default 20mbit)")
    ap.add_argument("--jobs", default=DEFAULT_JOBS, metavar="JOB[;JOB...]",
                    help=f"the jobs, in order, separated by ';' or ',': shorthands ({' '.join(JOBS)}), stock-none or "
                         "stock-fp16 (Horovod's own), or any hvd_gradq spec such as 'orq:levels=4,ef=true' "
                         f"(default {DEFAULT_JOBS})")
    ap.add_argument("--steps", type=int, default=300, help="steps of each job (default 300, the study's)")
    ap.add_argument("--lr", type=float, default=0.6, help="peak learning rate (default 0.6, the study's)")
    ap.add_argument("--target", type=float, default=65.0,
                    help="test accuracy in %% that the 'time to' row waits for (default 65)")
    ap.add_argument("--eval-every", type=int, default=10, help="score the test set every N steps (default 10)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the data, initial weights and rounding noise, the same in every job (default 0)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take (default 300)")
    ap.add_argument("--json", default="", metavar="PATH", help="also write every job's summary and link counters here")
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse_args()
    try:
        jobs = parse_jobs(a.jobs)
    except ValueError as e:
        ap.error(str(e))
    try:
        rate_bps = parse_rate(a.rate)
    except ValueError as e:
        ap.error(str(e))

    t0 = time.monotonic()
    load0 = os.getloadavg()
    emulated, why = emulation(a.rate)
    if emulated:
        link = (f"EMULATED: {RANKS} hosts (network namespaces), 1 rank each, each link shaped to {rate_bps / 1e6:g} "
                "Mbit/s each way by tc tbf; bytes read from the kernel's counters")
    else:
        link = (f"LOOPBACK, NOT EMULATED ({why}): horovodrun -np {RANKS} -H localhost:{RANKS} --gloo on one machine; "
                "no link is shaped, so step times show compute and loopback copies only, not a slow network")
    print(f"demo: MNIST-1D MLP 40-300-300-10, {RANKS} ranks, {a.steps} steps; link: {link}")
    if emulated:
        print(f"      ({why})")
    print(f"      load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs",
          flush=True)

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="hvdq-demo-") as tmp:
        for i, (title, spec) in enumerate(jobs):
            results.append(run_job(a, i, title, spec, emulated, Path(tmp)))
    total = time.monotonic() - t0
    load1 = os.getloadavg()

    s0 = results[0].summary
    print(f"\n\n== MNIST-1D, MLP 40-300-300-10 ({s0['params']:,} parameters), {RANKS} ranks, {s0['steps']} steps, "
          f"global batch {GLOBAL_BATCH}, SGD lr {a.lr:g} (Nesterov, wd 5e-4, warm-up {s0['warmup_steps']} steps, "
          f"cosine), seed {a.seed}")
    print(f"== link: {link}")
    if emulated:
        wire = s0["bytes_fp32"] / s0["steps"] * 1514 / 1448 * 8 / rate_bps  # TCP/IP/Ethernet headers per segment
        print(f"== an fp32 ring allreduce of the gradients needs {1000 * wire:.0f} ms of this link a step")
    print(f"== load average at start {load0[0]:.2f} (end {load1[0]:.2f}) on {os.cpu_count()} CPUs; "
          f"demo wall time {total:.0f} s\n")
    print(table(results, a.target, emulated))
    notes = [
        f"final test accuracy: one run of one seed (--seed {a.seed}); differences of a point or two between jobs are "
        "within the spread between seeds (the quality study, bench/quality/study.py, measures that).",
        f"time to {a.target:g}%: training time (evaluation excluded) until the first test evaluation at or above "
        f"it; the test set is scored every {a.eval_every} steps; every step counts, with the one-time costs of the "
        "first ones.",
        "mean step time: wall time of a step on rank 0, the first 5 steps left out; 'in the compressor': time "
        "inside compress+decompress, which includes waiting for hvd_gradq's own collective.",
        "bytes a rank sent: compressor.stats() for hvd_gradq; Horovod's own fp32/fp16 by the ring-allreduce model "
        "2(N-1)/N x gradient bytes.",
    ]
    if emulated:
        notes.append("bytes on the link: what host 0 put on its link between the start and end of training, from "
                     "/proc/net/dev: TCP/IP/Ethernet headers, ACKs, Horovod's negotiation and the evaluations' "
                     "allreduces included.")
    notes.append("total wall time: the whole launch (start-up, data, training, evaluation, shutdown).")
    if a.json:
        Path(a.json).write_text(json.dumps({"link": link, "rate": a.rate if emulated else None, "load_start": load0,
                                            "load_end": load1, "demo_wall_s": total,
                                            "jobs": [vars(r) for r in results]}, indent=1) + "\n")
    print("\n" + "\n".join(textwrap.fill(n, 110, initial_indent="- ", subsequent_indent="  ") for n in notes))


if __name__ == "__main__":
    main()
