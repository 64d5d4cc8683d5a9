"""The main job: train the MNIST-1D CNN on 2 ranks with ORQ-5 and with no compression, then show
the two summaries side by side.

    bash scripts/demo.sh                 # set-up if needed, then this
    .venv/bin/python scripts/demo.py --epochs 5      # shorter

Each run is ``horovodrun -np 2 -H localhost:2 --gloo`` of ``bench/train_mnist1d.py``, the measured
version of ``examples/torch_mnist1d.py`` (rank 0's progress bar and summary appear as it goes);
the summaries come back through ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = [("ORQ-5", "orq:levels=5"), ("no compression", "none")]


def launch(spec: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    hr = Path(sys.executable).parent / "horovodrun"
    cmd = [str(hr) if hr.exists() else "horovodrun", "-np", str(a.np), "-H", f"localhost:{a.np}", "--gloo",
           sys.executable, str(ROOT / "bench" / "train_mnist1d.py"), "--compression", spec,
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--seed", str(a.seed),
           "--json", str(out)]
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    print(f"\n$ {' '.join(cmd[:6])} ... train_mnist1d.py --compression {spec} --epochs {a.epochs}", flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=a.timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.terminate()  # horovodrun stops the ranks it started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(f"the {spec} run did not finish in {a.timeout:.0f} s and was stopped") from None
    if rc != 0 or not out.exists():
        raise SystemExit(f"the {spec} run failed (exit status {rc})")
    return json.loads(out.read_text())


def table(named: list[tuple[str, dict[str, Any]]]) -> str:
    def mib(b: float) -> str:
        return f"{b / 2**20:.2f} MiB"

    rows = [
        ("scheme", lambda s: s["compression"]),
        ("test accuracy", lambda s: f"{100 * s['test_accuracy']:.2f}%"),
        ("bytes sent (rank 0)", lambda s: mib(s["bytes_sent"])),
        ("fp32 allreduce would send", lambda s: mib(s["bytes_fp32"])),
        ("x less than fp32", lambda s: f"x{s['ratio_vs_fp32']:.2f}"),
        ("mean step time", lambda s: f"{1000 * s['step_time_s']:.1f} ms"),
        ("compress share", lambda s: f"{100 * s['compress_share']:.1f}%"),
        ("steps / epochs", lambda s: f"{s['steps']} / {s['epochs']:g}"),
    ]
    cells = [[""] + [name for name, _ in named]] + [[label] + [f(s) for _, s in named] for label, f in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10, help="epochs of each run (31 steps an epoch at 2 ranks)")
    ap.add_argument("--np", type=int, default=2, help="ranks")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    a = ap.parse_args()
    t0 = time.monotonic()
    named = []
    with tempfile.TemporaryDirectory(prefix="hvdq-demo-") as tmp:
        for label, spec in RUNS:
            named.append((label, launch(spec, a, Path(tmp) / f"{len(named)}.json")))
    print(f"\nMNIST-1D CNN, {a.np} ranks (horovodrun --gloo), {a.epochs} epochs, seed {a.seed}; "
          f"demo took {time.monotonic() - t0:.0f} s\n")
    print(table(named))
    print("\nbytes: compressor.stats() of rank 0, against a ring allreduce of the fp32 gradients; compress share: "
          "time inside the compressor's compress+decompress\n(encode, decode, and waiting for its own collective) "
          "over the step time.")


if __name__ == "__main__":
    main()
