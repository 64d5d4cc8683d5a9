#!/usr/bin/env python3
"""Model benchmark: real model shapes through stock Horovod, each compression against Horovod's
fp32 and fp16 in the same launch, on 2 ranks over each link and thread setting.

    sudo .venv/bin/python bench/models/bench_models.py --model resnet18 --framework torch
    .venv/bin/python bench/models/bench_models.py --links loopback --compressions fp32,fp16,orq,bingrad
    .venv/bin/python bench/models/bench_models.py --quick            # smoke run: a few seconds of training

For each link (``100mbit`` and ``1gbit``: 2 emulated hosts, ``bench/netemu/``, root only;
``loopback``: ``horovodrun --gloo -np 2`` on this host, no limit) and each thread setting
(``default``: ``OMP_NUM_THREADS`` unset; a number: that value), ONE launch trains every
compression of ``--compressions`` in interleaved rounds (``models_worker.py``). Entries are
``fp32`` / ``fp16`` (Horovod's own ``Compression.none`` / ``.fp16``) or any hvd_gradq spec
(``orq``, ``bingrad``, ``uniform:bits=4``, ``orq:levels=3,ef=true``; separate with ``;`` when
in doubt); ``fp16`` is added when missing, since every ratio is to it. A progress line per launch;
the report goes to ``results/models/<model>_<framework>.md`` (``--out``), the raw results and
every rank's output to ``results/raw/``. Models: ``catalog.py``; PyTorch ``torch_models.py``,
Keras ``keras_models.py``; the table: ``models_report.py``.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench.models import catalog  # noqa: E402
from bench.models.models_report import markdown, progress_line  # noqa: E402

WORKER = Path(__file__).resolve().with_name("models_worker.py")
LINKS = ("100mbit", "1gbit", "loopback")
QUICK = {"steps": 1, "warmup": 1, "rounds": 1, "links": "loopback", "threads": "default", "image": 32,
         "batch": 2, "seq": 16, "layers": 1}
QUICK_COMPRESSIONS = "fp16,bingrad"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(catalog.MODELS), default="resnet18")
    ap.add_argument("--framework", choices=["torch", "tf"], default="torch")
    ap.add_argument("--links", default=None, help=f"comma-separated, of {', '.join(LINKS)} (default: all)")
    ap.add_argument("--threads", default=None, help="comma-separated: default (OMP_NUM_THREADS unset) or a "
                    "number for OMP_NUM_THREADS (default: default,1)")
    ap.add_argument("--compressions", default=None,
                    help="fp32, fp16 (Horovod's) or hvd_gradq specs, ',' or ';' separated (default: fp32,fp16,orq,"
                    "bingrad; --quick: fp16,bingrad)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps a compression a round (5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps a compression first (3)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3)")
    ap.add_argument("--batch", type=int, default=None, help="a rank (default: the model's, 16 CNN, 8 BERT)")
    ap.add_argument("--image", type=int, default=None, help="CNN input size, square (64)")
    ap.add_argument("--seq", type=int, default=None, help="BERT sequence length (128)")
    ap.add_argument("--layers", type=int, default=None, help=f"BERT encoder layers ({catalog.BERT_LAYERS}; fewer "
                    "for speed on a small machine)")
    ap.add_argument("--link-rate", choices=["measured", "given"], default="measured",
                    help="emulated links: auto measures the rate at its first step, as in a user's job (default), "
                         "or is told it (HVD_GRADQ_LINK_GBPS)")
    ap.add_argument("--seed", type=int, default=catalog.RUN["seed"])
    ap.add_argument("--lr", type=float, default=catalog.RUN["lr"])
    ap.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items())
                    + f", compressions {QUICK_COMPRESSIONS} (flags given still win)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a launch")
    ap.add_argument("--note", default="", help="a line in bold at the top of the report (e.g. a smoke run)")
    ap.add_argument("--out", default="", help="report (default results/models/<model>_<framework>.md; "
                    "--quick: results/raw/models_<model>_<framework>_quick.md)")
    ap.add_argument("--raw", default=str(ROOT / "results" / "raw"), help="folder for the raw results and the log")
    args = ap.parse_args(argv)
    defaults = {**catalog.RUN, "links": ",".join(LINKS), "threads": "default,1",
                "batch": catalog.MODELS[args.model].batch}
    if args.quick:
        defaults.update(QUICK, compressions=QUICK_COMPRESSIONS)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    try:
        args.compressions = catalog.parse_compressions(args.compressions)
        if catalog.REFERENCE not in args.compressions:
            args.compressions.insert(0, catalog.REFERENCE)
        catalog.check_compressions(args.compressions)
    except ValueError as e:
        ap.error(f"--compressions: {e}")
    args.links = [s.strip() for s in args.links.split(",") if s.strip()]
    args.threads = [s.strip() for s in args.threads.split(",") if s.strip()]
    if not args.links or set(args.links) - set(LINKS):
        ap.error(f"--links: each of {', '.join(LINKS)}")
    if not args.threads or any(t != "default" and not (t.isdigit() and int(t) > 0) for t in args.threads):
        ap.error("--threads: 'default' or positive numbers")
    if min(args.steps, args.rounds, args.batch, args.image, args.seq, args.layers) < 1 or args.warmup < 0:
        ap.error("--steps, --rounds, --batch, --image, --seq, --layers must be >= 1, --warmup >= 0")
    stem = f"{args.model}_{args.framework}"
    args.out = Path(args.out) if args.out else (ROOT / "results" / "raw" / f"models_{stem}_quick.md" if args.quick
                                                else ROOT / "results" / "models" / f"{stem}.md")
    return args


def worker_argv(args: argparse.Namespace, threads: str, result: Path) -> list[str]:
    """One rank's command: ``env`` sets or clears OMP_NUM_THREADS (a launcher's environment
    can only add variables, and ``default`` must remove one the caller's shell may have set)."""
    env = ["env", "-u", "OMP_NUM_THREADS"] if threads == "default" else ["env", f"OMP_NUM_THREADS={threads}"]
    return [*env, sys.executable, str(WORKER), "--framework", args.framework, "--model", args.model,
            "--compressions", ";".join(args.compressions), "--batch", str(args.batch), "--image", str(args.image),
            "--seq", str(args.seq), "--layers", str(args.layers), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--seed", str(args.seed),
            "--lr", str(args.lr), "--result", str(result)]


def run_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
            # one transfer of a 64 MB fusion buffer at 100 Mbit/s on a loaded machine takes seconds;
            # Gloo's 30 s default would end a slow launch that is not hung
            "HOROVOD_GLOO_TIMEOUT_SECONDS": os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "600")}


def launch_loopback(argv: list[str], timeout: float, log: IO[str]) -> str | None:
    """``horovodrun --gloo -np 2`` on this host, its output into ``log`` as it comes; None, or why
    it failed."""
    hr = Path(sys.executable).with_name("horovodrun")
    cmd = [str(hr) if hr.exists() else "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", *argv]
    env = {**os.environ, **run_env()}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            log.write(line)
            log.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except BaseException as e:  # the timeout, or this process told to stop (see main): no orphaned ranks
        os.killpg(proc.pid, signal.SIGKILL)  # horovodrun and both ranks: its own session
        proc.wait()
        reader.join(timeout=5)
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return f"timeout after {timeout:.0f} s"
    reader.join(timeout=5)
    return None if code == 0 else f"horovodrun exited with {code}: {''.join(tail)[-1500:]}"


def launch_emulated(argv: list[str], rate: str, timeout: float, log: IO[str], given: bool) -> str | None:
    """2 emulated hosts with links shaped to ``rate`` (root); None, or why it failed. ``given``:
    auto's cost model is told the rate (``HVD_GRADQ_LINK_GBPS``), else it measures it."""
    from bench import netemu

    env = run_env()
    env.pop("HVD_GRADQ_LINK_GBPS", None)
    with netemu.EmulatedCluster(2, rate=rate) as c:
        if given:
            env["HVD_GRADQ_LINK_GBPS"] = f"{c.rate_bps / 1e9:g}"
        res = c.run(argv, env=env, timeout=timeout, cwd=str(ROOT), echo=log)
    return None if res.ok else f"{res.error}\n{res.summary(1500)}"


def run_one(args: argparse.Namespace, link: str, threads: str, log: IO[str]) -> dict[str, Any]:
    run: dict[str, Any] = {"link": link, "threads": threads, "load_before": list(os.getloadavg())}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hvdq-models-") as tmp:
        result = Path(tmp) / "result.json"
        argv = worker_argv(args, threads, result)
        log.write(f"\n=== {link}, threads {threads}: {shlex.join(argv)}\n")
        error = (launch_loopback(argv, args.timeout, log) if link == "loopback"
                 else launch_emulated(argv, link, args.timeout, log, args.link_rate == "given"))
        if error is None and not result.exists():
            error = "rank 0 wrote no result"
        if error is None:
            run["result"] = json.loads(result.read_text())
        else:
            run["error"] = error
    run["seconds"] = time.monotonic() - t0
    run["load_after"] = list(os.getloadavg())
    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a test's timeout, a scheduler) unwinds like Ctrl-C, so the launch's ranks are killed
        signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    emulated = any(link != "loopback" for link in args.links)  # root: namespaces and tc
    if emulated:
        from bench import netemu

        try:
            netemu.preflight()
        except netemu.NetEmuError as e:
            print(f"bench_models: {e} (or run --links loopback)", file=sys.stderr)
            return 1
    given = list(sys.argv[1:] if argv is None else argv)
    doc: dict[str, Any] = {
        "model": args.model, "framework": args.framework, "note": args.note, "link_rate": args.link_rate,
        "command": ("sudo " if emulated else "") + ".venv/bin/python bench/models/bench_models.py " + shlex.join(given),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "load_before": list(os.getloadavg()), "runs": [],
    }
    raw = Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plan = [(link, t) for link in args.links for t in args.threads]
    stem = args.out.stem if args.out.stem.startswith("models_") else f"models_{args.out.stem}"
    with open(raw / f"{stem}.log", "w") as log:
        for k, (link, threads) in enumerate(plan, 1):
            run = run_one(args, link, threads, log)
            doc["runs"].append(run)
            doc["load_after"] = run["load_after"]
            print(f"bench_models: [{k}/{len(plan)}] {args.model} {args.framework} {link}, threads {threads} "
                  f"({run['seconds']:.0f} s, load {run['load_before'][0]:.1f}->{run['load_after'][0]:.1f}): "
                  f"{progress_line(run)}", flush=True)
            (raw / f"{stem}.json").write_text(json.dumps(doc, indent=1))
            args.out.write_text(markdown(doc))
    print(f"bench_models: wrote {args.out}")
    failed = [r for r in doc["runs"] if "error" in r or not all(
        c["ranks_equal"] for c in r["result"]["compressions"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
