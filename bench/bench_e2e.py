#!/usr/bin/env python3
"""End-to-end benchmark on emulated hosts: every scheme against Horovod's and DDP's own compression.

    sudo .venv/bin/python scripts/bench_e2e.py                 # 4 hosts, 100mbit and 1gbit
    .venv/bin/python scripts/bench_e2e.py --rates 1gbit --steps 2 --schemes ORQ-5,none   # quicker

Builds N hosts as network namespaces with shaped links (``hvd_gradq/bench/netemu.py``, root only),
starts one rank per host, and in ONE launch per bandwidth trains the same MLP (MNIST-1D input,
three hidden layers of 2304: 10.7M parameters, 41 MB of fp32 gradients) with each scheme in turn:
``--warmup`` untimed steps, then ``--steps`` timed ones between two phase marks, at which the
launcher reads every host's kernel byte counters. Per scheme it reports the step time (slowest
rank, mean over the timed steps), the bytes that crossed each host's link per step, and for the
hvd_gradq schemes the bytes ``stats()`` says the rank sent, with the ratio of the two. The peers
run in the same launch: Horovod's ``Compression.fp16``, and ``DistributedDataParallel`` over Gloo
with ``fp16_compress_hook`` and ``powerSGD_hook`` (rank 4), plus uncompressed baselines of both.

``--tta`` adds time to a target test accuracy: the same model trained on MNIST-1D with each
scheme (Adam), evaluated every ``--tta-every`` steps, until ``--tta-target`` or ``--tta-steps``.
Writes ``results/e2e.md``, ``results/e2e_step_time.png`` and ``results/raw/e2e.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "examples", ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from hvd_gradq.bench import netemu  # noqa: E402

TOKEN = "E2E_RESULT"
#: Bytes of Ethernet (14) + IPv4 (20) + TCP with timestamps (32) headers on every packet: the
#: TCP payload that crossed a link is its byte count minus this per packet (ACKs carry none).
HEADER_BYTES = 66
DONE = "E2E_DONE"
HIDDEN = 2304
DDP_PORT = 29517


@dataclass(frozen=True)
class Entry:
    label: str
    spec: str  # an hvd_gradq spec, or stock-none / stock-fp16 (Horovod), ddp-none / ddp-fp16 / ddp-powersgd
    bits: float  # nominal bits an element on the wire, for the "at or below 4 bits" target

    @property
    def kind(self) -> str:
        if self.spec.startswith("stock-"):
            return "horovod"
        if self.spec.startswith("ddp-"):
            return "ddp"
        return "gradq"


ENTRIES = [
    Entry("none (Horovod fp32)", "stock-none", 32),
    Entry("Horovod fp16", "stock-fp16", 16),
    Entry("DDP fp32", "ddp-none", 32),
    Entry("DDP fp16_compress_hook", "ddp-fp16", 16),
    Entry("DDP powerSGD_hook r4", "ddp-powersgd", 0),
    Entry("ORQ-3", "orq:levels=3", 1.6),
    Entry("ORQ-5", "orq:levels=5", 2.33),
    Entry("ORQ-9", "orq:levels=9", 3.2),
    Entry("BinGrad+EF", "bingrad:ef=true", 1),
    Entry("QSGD (4 levels)", "qsgd", 3),
    Entry("TernGrad", "terngrad", 1.6),
    Entry("sign+EF", "sign:ef=true", 1),
    Entry("Top-K 1% +EF", "topk:ratio=0.01,ef=true", 0.5),
]
TTA_DEFAULT = ("none (Horovod fp32)", "Horovod fp16", "DDP fp16_compress_hook", "DDP powerSGD_hook r4", "ORQ-3",
               "ORQ-5", "BinGrad+EF")


# ============================================================================== worker (one rank)


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(40, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10),
    )


class _Trainer:
    """One scheme's model, optimizer and communication, with a ``step`` and an ``accuracy``."""

    def __init__(self, entry: Entry, index: int, seed: int, lr: float, data: dict[str, Any]) -> None:
        import horovod.torch as hvd
        import torch

        import hvd_gradq.torch as gq

        self.entry, self.data, self.comp = entry, data, None
        self.rank, self.size = hvd.rank(), hvd.size()
        self.model = _model(seed)
        opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.gen = torch.Generator().manual_seed(seed * 1000 + self.rank)
        if entry.kind == "ddp":
            import torch.distributed as dist
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
            from torch.nn.parallel import DistributedDataParallel as DDP

            if not dist.is_initialized():
                os.environ.setdefault("GLOO_SOCKET_IFNAME", netemu.HOST_IFACE)
                dist.init_process_group("gloo", init_method=f"tcp://{netemu.host_addr(0)}:{DDP_PORT}",
                                        rank=self.rank, world_size=self.size)
            # PowerSGD's hook issues its second allreduce from a future's callback thread; with
            # several buckets, ranks can issue them in different orders and Gloo aborts
            # ("Received data size doesn't match expected size"). One bucket keeps the order.
            cap = 1024 if entry.spec == "ddp-powersgd" else 25
            self.net: Any = DDP(self.model, bucket_cap_mb=cap)
            if entry.spec == "ddp-fp16":
                self.net.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif entry.spec == "ddp-powersgd":
                state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                                    start_powerSGD_iter=2, min_compression_rate=2, random_seed=seed)
                self.net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            self.opt = opt
        else:
            named = [(f"e{index}.{n}", p) for n, p in self.model.named_parameters()]
            if entry.spec == "stock-none":
                comp: Any = hvd.Compression.none
            elif entry.spec == "stock-fp16":
                comp = hvd.Compression.fp16
            else:
                comp = self.comp = gq.from_spec(entry.spec, named_parameters=named)
            self.net = self.model
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=named, compression=comp)

    def step(self, batch: int) -> tuple[float, float]:
        """One training step on a random batch of this rank's shard: (seconds, loss)."""
        import torch
        import torch.nn.functional as F

        x, y = self.data["x"], self.data["y"]
        idx = torch.randint(0, x.shape[0], (batch,), generator=self.gen)
        t = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.net(x[idx]), y[idx])
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t, float(loss.detach())

    def accuracy(self) -> float:
        import torch

        with torch.no_grad():
            pred = self.model(self.data["x_test"]).argmax(1)
        return float((pred == self.data["y_test"]).float().mean())

    def sent(self) -> tuple[int, int]:
        if self.comp is None:
            return 0, 0
        tot = self.comp.stats()["total"]["all"]
        return int(tot["sent"]), int(tot["received"])


def _compute_only(seed: int, lr: float, data: dict[str, Any], batch: int, steps: int) -> float:
    """Mean seconds of forward + backward + Adam with no communication at all (the compute floor)."""
    import torch
    import torch.nn.functional as F

    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    times = []
    for i in range(steps + 1):
        idx = torch.randint(0, data["x"].shape[0], (batch,))
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(data["x"][idx]), data["y"][idx]).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t)
    return sum(times) / len(times)


def worker(args: argparse.Namespace) -> None:
    import common
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    raw = common.load_mnist1d()
    xs, ys = common.shard(raw["x"], raw["y"], rank, size)
    data = {"x": torch.from_numpy(xs), "y": torch.from_numpy(ys),
            "x_test": torch.from_numpy(raw["x_test"]), "y_test": torch.from_numpy(raw["y_test"])}
    entries = [e for e in ENTRIES if e.label in args.labels]
    out: dict[str, Any] = {"rank": rank, "size": size, "schemes": {}}
    params = sum(p.numel() for p in _model(0).parameters())
    out["params"] = params
    out["compute_s"] = _compute_only(args.seed, args.lr, data, args.batch, 3)
    hvd.allreduce(torch.zeros(1), name="e2e.warm")  # connections up before the idle phase
    netemu.phase("idle.a")
    time.sleep(args.idle)  # Horovod's background negotiation only: its rate, to tell it apart
    netemu.phase("idle.b")
    for i, e in enumerate(entries):
        tr = _Trainer(e, i, args.seed, args.lr, data)
        for _ in range(args.warmup):
            tr.step(args.batch)
        s0 = tr.sent()
        netemu.phase(f"s{i}.a")
        times = [tr.step(args.batch)[0] for _ in range(args.steps)]
        netemu.phase(f"s{i}.b")
        s1 = tr.sent()
        res: dict[str, Any] = {"times": times, "stats_sent": s1[0] - s0[0], "stats_received": s1[1] - s0[1]}
        if e.label in args.tta_labels:
            res["tta"] = _time_to_accuracy(e, i, args, data)
        out["schemes"][e.label] = res
        del tr
        if rank == 0:
            print(f"{DONE} {e.label}", flush=True)
    print(f"{TOKEN} {json.dumps(out)}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    hvd.shutdown()


def _time_to_accuracy(e: Entry, i: int, args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Train a fresh model with this scheme until the test accuracy reaches the target."""
    import horovod.torch as hvd
    import torch

    tr = _Trainer(e, 100 + i, args.seed + 1, args.lr, data)
    elapsed, curve, reached = 0.0, [], None
    for step in range(1, args.tta_steps + 1):
        elapsed += tr.step(args.batch)[0]
        if step % args.tta_every == 0:
            acc = tr.accuracy()  # identical weights on every rank: each scores the whole test set
            t = float(hvd.allreduce(torch.tensor([elapsed]), op=hvd.Max, name=f"tta.{i}.{step}")[0])
            curve.append((step, t, acc))
            if acc >= args.tta_target:
                reached = (step, t)
                break
    return {"curve": curve, "reached": reached}


# ============================================================================== launcher


def _parse_worker_out(res: netemu.RunResult) -> list[dict[str, Any]]:
    outs = []
    for text in res.stdout:
        for line in text.splitlines():
            if line.startswith(TOKEN + " "):
                outs.append(json.loads(line[len(TOKEN) + 1 :]))
    return outs


class _Progress:
    """An ``echo`` sink for the cluster run: advances a bar on rank 0's per-scheme lines and keeps
    everything else for the log."""

    def __init__(self, bar: Any, log: Any) -> None:
        self.bar, self.log = bar, log

    def write(self, s: str) -> int:
        self.log.write(s)
        if s.startswith(f"[h0] {DONE} "):
            self.bar.set_postfix_str(s.split(DONE, 1)[1].strip()[:30])
            self.bar.update(1)
        return len(s)

    def flush(self) -> None:
        self.log.flush()


def _payload(c: netemu.HostCounters) -> int:
    """TCP payload bytes a host sent: its link's bytes less the headers of every packet."""
    return c.bytes_sent - HEADER_BYTES * c.packets_sent


def run_rate(args: argparse.Namespace, rate: str, bar: Any, log: Any) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(args.batch), "--seed", str(args.seed), "--lr", str(args.lr),
            "--idle", str(args.idle),
            "--schemes", ",".join(args.labels), "--tta-schemes", ",".join(args.tta_labels),
            "--tta-target", str(args.tta_target), "--tta-steps", str(args.tta_steps),
            "--tta-every", str(args.tta_every)]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]), "OMP_NUM_THREADS": "1",
           "HVD_GRADQ_CACHE": os.environ.get("HVD_GRADQ_CACHE", str(Path.home() / ".cache" / "hvd_gradq"))}
    with netemu.EmulatedCluster(args.hosts, rate=rate) as c:
        res = c.run(argv, env=env, timeout=args.timeout, cwd=str(ROOT), echo=_Progress(bar, log))
    if not res.ok:
        raise SystemExit(f"bench_e2e: the run at {rate} failed: {res.error}\n{res.summary()}")
    outs = {o["rank"]: o for o in _parse_worker_out(res)}
    if sorted(outs) != list(range(args.hosts)):
        raise SystemExit(f"bench_e2e: ranks {sorted(outs)} reported, expected {args.hosts}\n{res.summary()}")
    entries = [e for e in ENTRIES if e.label in args.labels]
    idle = res.delta("idle.a", "idle.b")
    idle_s = res.seconds("idle.a", "idle.b")
    chatter = [_payload(c) / idle_s for c in idle]  # payload B/s per host
    rows: dict[str, Any] = {}
    for i, e in enumerate(entries):
        steps = args.steps
        per_step = [max(outs[r]["schemes"][e.label]["times"][k] for r in outs) for k in range(steps)]
        d = res.delta(f"s{i}.a", f"s{i}.b")
        t = res.seconds(f"s{i}.a", f"s{i}.b")
        row: dict[str, Any] = {
            "step_s": sum(per_step) / steps, "step_times": per_step, "phase_s": t,
            "wire_sent": [c.bytes_sent / steps for c in d], "wire_recv": [c.bytes_recv / steps for c in d],
            "payload_sent": [_payload(c) / steps for c in d],
            "retrans": [c.tcp_retrans for c in d],
        }
        if e.kind == "gradq":
            row["stats_sent"] = [outs[r]["schemes"][e.label]["stats_sent"] / steps for r in range(args.hosts)]
            row["stats_received"] = [outs[r]["schemes"][e.label]["stats_received"] / steps for r in range(args.hosts)]
        if "tta" in outs[0]["schemes"][e.label]:
            row["tta"] = outs[0]["schemes"][e.label]["tta"]
        rows[e.label] = row
    return {"rate": rate, "rate_bps": res.rate_bps, "params": outs[0]["params"], "chatter_Bps": chatter,
            "compute_s": max(o["compute_s"] for o in outs.values()), "schemes": rows,
            "load": os.getloadavg()}


# ============================================================================== report


def fmt_mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def byte_errors(r: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per host: (TCP payload sent / stats sent - 1), and the payload beyond stats in bytes per
    second of the phase (to compare with Horovod's own negotiation rate when idle)."""
    raw = [p / st - 1 for p, st in zip(r["payload_sent"], r["stats_sent"])]
    steps = len(r["step_times"])
    excess = [(p - st) * steps / r["phase_s"] for p, st in zip(r["payload_sent"], r["stats_sent"])]
    return raw, excess


def report(runs: list[dict[str, Any]], args: argparse.Namespace, cmd: str) -> str:
    lines = ["# End-to-end: step time and bytes on an emulated 4-host network", ""]
    p = runs[0]["params"]
    lines += [
        f"{args.hosts} hosts (network namespaces on a bridge, each link shaped by `tc tbf` both ways; "
        f"`hvd_gradq/bench/netemu.py`), one rank a host, Horovod over Gloo. Model: MLP 40-{HIDDEN}-{HIDDEN}-"
        f"{HIDDEN}-10, **{p / 1e6:.2f}M parameters** ({p * 4 / 1e6:.1f} MB of fp32 gradients), Adam, batch "
        f"{args.batch} a rank, MNIST-1D. Step = forward + backward + communication + optimizer step; the "
        f"time is the slowest rank's, mean of {args.steps} timed steps after {args.warmup} warm-up steps. "
        "All rows of a bandwidth ran in one launch, on a 2-core machine running all 4 ranks: CPU time is "
        "shared, so compute and compression cost about twice what a host of its own would pay.",
        "",
        "Bytes, per host and step, from the kernel's counters of each host's link (`/proc/net/dev` in its "
        "namespace): **wire** = bytes sent, headers included; **payload** = wire minus 66 bytes "
        "(Ethernet + IPv4 + TCP with timestamps) per packet sent, i.e. the TCP payload (ACKs carry none); "
        "**stats** = what the compressor's `stats()` says this rank sent. **payload/stats** is the ratio "
        "(mean over hosts, and the host furthest from 1); **excess kB/s** is the payload beyond stats per "
        "second of the phase (worst host), to set against Horovod's own background negotiation (request "
        "and response lists every cycle), measured in an idle phase of the same run: what crosses besides "
        "the compressed gradients is Horovod's control traffic, so it grows with the step time, not with "
        "the payload.",
        "",
        f"Reproduce (root): `{cmd}`",
        "",
    ]
    for run in runs:
        base = run["schemes"].get("none (Horovod fp32)", {}).get("step_s")
        ch = _mean(run["chatter_Bps"])
        lines += [f"## {run['rate']}", "",
                  f"Compute alone (no communication): {run['compute_s'] * 1e3:.0f} ms a step. Horovod's "
                  f"background negotiation when idle: {ch / 1e3:.1f} kB/s a host. Load average at the end: "
                  f"{run['load'][0]:.1f}.", "",
                  "| scheme | step s | speed-up vs none | wire MB | payload MB | stats MB | payload/stats "
                  "(worst host) | excess kB/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for label, r in run["schemes"].items():
            su = f"{base / r['step_s']:.2f}x" if base else "-"
            cells = [f"{r['step_s']:.3f}", su, fmt_mb(_mean(r["wire_sent"])), fmt_mb(_mean(r["payload_sent"]))]
            if "stats_sent" in r and all(r["stats_sent"]):
                raw, excess = byte_errors(r)
                cells += [fmt_mb(_mean(r["stats_sent"])),
                          f"{1 + _mean(raw):.3f} ({max(raw, key=abs) * 100:+.1f}%)",
                          f"{max(excess) / 1e3:.0f}"]
            else:
                cells += ["-", "-", "-"]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += targets(run)
        tta = [(label, r["tta"]) for label, r in run["schemes"].items() if "tta" in r]
        if tta:
            lines += ["", f"Time to {args.tta_target * 100:.0f}% test accuracy (fresh model, at most "
                      f"{args.tta_steps} steps, accuracy checked every {args.tta_every} steps; training time "
                      "only, slowest rank):", "", "| scheme | steps | seconds | best accuracy seen |",
                      "|---|---:|---:|---:|"]
            for label, t in tta:
                best = max((c[2] for c in t["curve"]), default=0.0)
                if t["reached"]:
                    lines.append(f"| {label} | {t['reached'][0]} | {t['reached'][1]:.1f} | {best * 100:.1f}% |")
                else:
                    lines.append(f"| {label} | not reached | - | {best * 100:.1f}% |")
        lines.append("")
    lines += ["![step time per scheme and bandwidth](e2e_step_time.png)", ""]
    return "\n".join(lines)


def targets(run: dict[str, Any]) -> list[str]:
    s = run["schemes"]
    out = ["Targets (ratios within this run):", ""]

    def t(label: str) -> Optional[float]:
        return s[label]["step_s"] if label in s else None

    none, hfp16, dfp16 = t("none (Horovod fp32)"), t("Horovod fp16"), t("DDP fp16_compress_hook")
    if run["rate"].lower().startswith("100m") and none:
        for lab in ("ORQ-3", "BinGrad+EF"):
            if t(lab):
                r = none / t(lab)  # type: ignore[operator]
                out.append(f"- {lab} >= 3x faster than none: {r:.2f}x, **{'met' if r >= 3 else 'not met'}**")
        if hfp16 and dfp16:
            for e in ENTRIES:
                if e.kind == "gradq" and e.bits <= 4 and t(e.label):
                    ok = t(e.label) < min(hfp16, dfp16)  # type: ignore[operator]
                    out.append(f"- {e.label} faster than both fp16 peers ({t(e.label):.3f} s vs "
                               f"{hfp16:.3f} / {dfp16:.3f} s): **{'met' if ok else 'not met'}**")
    if run["rate"].lower().startswith("1g") and hfp16 and t("ORQ-5"):
        ok = t("ORQ-5") < hfp16  # type: ignore[operator]
        out.append(f"- ORQ-5 faster than Horovod fp16 ({t('ORQ-5'):.3f} s vs {hfp16:.3f} s): "
                   f"**{'met' if ok else 'not met'}**")
    errs = {label: byte_errors(r) for label, r in s.items() if "stats_sent" in r and all(r["stats_sent"])}
    if errs:
        within = [label for label, (raw, _) in errs.items() if max(abs(e) for e in raw) <= 0.05]
        beyond = {label: max(ex) for label, (raw, ex) in errs.items() if label not in within}
        idle = max(run["chatter_Bps"])
        line = (f"- TCP payload that crossed each link within 5% of `stats()`: **met for {len(within)} of "
                f"{len(errs)} schemes** ({', '.join(within)})")
        if beyond:
            rates = ", ".join(f"{v / 1e3:.0f}" for v in beyond.values())
            below = all(v <= idle for v in beyond.values())
            line += (f"; not for {', '.join(beyond)}, whose excess ({rates} kB/s) is "
                     + ("below" if below else "NOT below")
                     + f" Horovod's idle negotiation rate ({idle / 1e3:.0f} kB/s, busiest host)"
                     + (": their steps are the longest for their payload" if below else ""))
        out.append(line)
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs[0]["schemes"])
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5.5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        vals = [run["schemes"][lab]["step_s"] for lab in labels]
        colors = ["#999999" if ("Horovod" in lab or "DDP" in lab or lab.startswith("none")) else "#1f77b4"
                  for lab in labels]
        ax.barh(labels[::-1], vals[::-1], color=colors[::-1])
        ax.axvline(run["compute_s"], color="k", ls=":", lw=1, label="compute alone")
        ax.set_xlabel("step time, s (slowest of 4 ranks)")
        ax.set_title(f"{run['rate']} links, {run['params'] / 1e6:.1f}M parameters")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--steps", type=int, default=3, help="timed steps a scheme")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (PowerSGD starts at step 2)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of the idle phase (background traffic)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--schemes", default="", help="comma-separated labels (default: all): " +
                    ", ".join(e.label for e in ENTRIES))
    ap.add_argument("--tta", action="store_true", help="also measure time to --tta-target accuracy")
    ap.add_argument("--tta-rates", default="1gbit", help="bandwidths at which --tta runs")
    ap.add_argument("--tta-schemes", default="", help="labels for --tta (default: a representative subset)")
    ap.add_argument("--tta-target", type=float, default=0.5)
    ap.add_argument("--tta-steps", type=int, default=150)
    ap.add_argument("--tta-every", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=3000.0)
    ap.add_argument("--out", default=str(ROOT / "results" / "e2e.md"))
    ap.add_argument("--from-json", default="", help="only rewrite the report from this raw results file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    known = [e.label for e in ENTRIES]
    args.labels = [s.strip() for s in args.schemes.split(",") if s.strip()] or known
    tta = [s.strip() for s in args.tta_schemes.split(",") if s.strip()]
    if args.worker:
        args.tta_labels = tta
        worker(args)
        return 0
    args.tta_labels = (tta or [lab for lab in TTA_DEFAULT if lab in args.labels]) if args.tta else []
    bad = [s for s in args.labels + args.tta_labels if s not in known]
    if bad:
        print(f"bench_e2e: unknown scheme label(s) {bad}; valid: {known}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.hosts < 2:
        print("bench_e2e: --steps must be >= 1 and --hosts >= 2", file=sys.stderr)
        return 2
    if args.from_json:  # regenerate the table and plot from an earlier run's raw results
        runs = json.loads(Path(args.from_json).read_text())
        return _write(runs, args, argv)
    try:
        netemu.preflight()
    except netemu.NetEmuError as e:
        print(f"bench_e2e: {e}", file=sys.stderr)
        return 1
    from tqdm import tqdm

    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    tta_rates = {r.strip() for r in args.tta_rates.split(",")}
    raw = ROOT / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    runs = []
    t0 = time.monotonic()
    with open(raw / "e2e.log", "w") as log, tqdm(total=len(rates) * len(args.labels), desc="bench_e2e",
                                                 unit="scheme") as bar:
        for rate in rates:
            a = argparse.Namespace(**vars(args))
            if rate not in tta_rates:
                a.tta_labels = []
            bar.set_description(f"bench_e2e {rate}")
            runs.append(run_rate(a, rate, bar, log))
            (raw / "e2e.json").write_text(json.dumps(runs, indent=1))
    print(f"bench_e2e: measured in {time.monotonic() - t0:.0f} s")
    return _write(runs, args, argv)


def _write(runs: list[dict[str, Any]], args: argparse.Namespace, argv: Optional[list[str]]) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    words = [w for i, w in enumerate(given)
             if not w.startswith("--from-json") and (i == 0 or given[i - 1] != "--from-json")]
    cmd = " ".join(["sudo .venv/bin/python scripts/bench_e2e.py", *words])
    out = Path(args.out)
    text = report(runs, args, cmd)
    out.write_text(text)
    plot(runs, out.with_name("e2e_step_time.png"))
    print(text)
    print(f"bench_e2e: wrote {out} and {out.with_name('e2e_step_time.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
