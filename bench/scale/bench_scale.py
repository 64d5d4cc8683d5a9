#!/usr/bin/env python3
"""The cost model against an emulated network: 2, 4, 8 hosts x 1 rank and 2 hosts x 2 ranks (issue 16).

    sudo .venv/bin/python bench/scale/bench_scale.py        # every topology, scheme and pattern at 1gbit
    sudo .venv/bin/python bench/scale/bench_scale.py --topologies 2x1,2x2 --schemes orq:levels=5 --steps 3

For each topology (hosts x ranks a host, ``bench/netemu/``: network namespaces, links shaped
by ``tc tbf`` to ``--rate`` both ways) ONE launch trains a small MLP (``scale_worker.LAYERS``:
2.64M parameters in four weight matrices and four bias vectors, deterministic synthetic data,
SGD) with each entry in turn: ``--warmup`` untimed steps, then ``--steps`` timed ones between
two phase marks, at which the launcher reads every host's kernel counters. The entries: Horovod's
own fp32 and ``Compression.fp16``, and for each scheme every pattern of
``hvd_gradq.plan.pattern.REQUESTABLE`` the scheme accepts (``summable`` only for
``Combine.SUMMABLE`` schemes, ``hierarchical`` only with several ranks a host; the list is read
at run time), forced, plus ``auto``. The ranks get ``HVD_GRADQ_LINK_GBPS`` = the emulated rate.

Per entry it reports, per host and step: the TCP payload that crossed the host's link each way
(link bytes less 66 header bytes a packet, less Horovod's idle negotiation rate, measured in an
idle phase, times the phase's duration); the model; their ratio (target: within 5%); the step
time (slowest rank, median over the timed steps); and for ``auto`` the patterns it used
(``stats()``: tensors and bytes per pattern) and whether that pattern is the measured fastest of
the forced ones or within 10% of it.

The model (per host, per step): the sum over the model's tensors of ``patterns.cost(scheme, n,
ndim, N, p, local=L)``, p = ``patterns.decide(scheme, n, ndim, N, requested, local=L,
link_gbps=rate)`` (``fp32_cost`` where p is fp32): ``cost`` with ``local`` is what one host's link
carries; a library whose ``cost`` takes no ``local`` gives a rank's bytes, summed over the host's
L ranks. Horovod's baselines: its ring over the N ranks in rank order, 2(N-1)/N x 4 (fp32)
or 2 (fp16) bytes an element a rank, where only ring edges between hosts cost link bytes (one
leaves and one enters each host). With L > 1 a second column, the *wire model*, follows Gloo's
algorithms over the rank ring for the flat patterns: allreduce and allgather are rings (one edge
a host crosses the link, carrying N-1 payloads for an allgather), alltoall sends directly (only
chunks for ranks on other hosts cross); with L = 1 both columns agree.

Writes ``results/scale/scale_emulated.md``, ``results/scale/scale_emulated.png`` (step time per entry per
topology) and ``results/scale/scale_emulated.json`` (raw; ``--from-json`` rewrites the report from it).
The worker (one rank) is ``scale_worker.py``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench import netemu  # noqa: E402
from bench.scale.scale_worker import DONE, HEADER_BYTES, TOKEN, Entry, shapes, worker  # noqa: E402

DEFAULT_TOPOLOGIES = "2x1,4x1,8x1,2x2"
DEFAULT_SCHEMES = "orq:levels=3,orq:levels=5,bingrad,qsgd:levels=4,terngrad"
BASELINES = ("stock-fp32", "stock-fp16")
RATIO_TOL = 0.05  # measured / model within 5%
AUTO_TOL = 0.10  # auto's pattern within 10% of the fastest


# ============================================================================== entries and model


def parse_topology(text: str) -> tuple[int, int]:
    """``"4x1"`` -> (4 hosts, 1 rank a host)."""
    try:
        h, r = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"topology must be HOSTSxRANKS (e.g. 2x2), not {text!r}") from None
    if h < 1 or r < 1:
        raise ValueError(f"topology {text!r}: hosts and ranks a host must be >= 1")
    return h, r


def _scheme(spec: str) -> Any:
    """The scheme ``spec`` names: ``parse`` gives a config (the scheme and its policy) since the
    policy split, the scheme itself before (this script also measures older versions)."""
    from hvd_gradq import parse

    got = parse(spec)
    return getattr(got, "scheme", got)


def patterns_for(spec: str, local: int, only: Optional[list[str]] = None) -> list[str]:
    """Every requestable pattern ``spec`` accepts (read from the library now), ``auto`` last;
    ``only`` keeps those named."""
    from hvd_gradq.plan.pattern import REQUESTABLE, Pattern
    from hvd_gradq.schemes.scheme import Combine

    scheme = _scheme(spec)
    out = []
    for p in REQUESTABLE:
        if p is Pattern.AUTO:
            continue
        if p is Pattern.SUMMABLE and scheme.combine is not Combine.SUMMABLE:
            continue
        if p.value == "hierarchical" and local <= 1:
            continue
        out.append(p.value)
    return [p for p in [*out, Pattern.AUTO.value] if not only or p in only]


def entries_for(schemes: list[str], local: int, baselines: bool = True,
                only: Optional[list[str]] = None) -> list[Entry]:
    out = [Entry(b, "") for b in BASELINES] if baselines else []
    for spec in schemes:
        out += [Entry(spec, p) for p in patterns_for(spec, local, only)]
    return out


def _takes_local(fn: Callable[..., Any]) -> bool:
    return "local" in _params(fn)


def _kw(fn: Callable[..., Any], local: int) -> dict[str, Any]:
    """``local=L`` (L > 1), ``link_gbps`` (from ``HVD_GRADQ_LINK_GBPS``, as the ranks read it) and
    ``fallback=False`` for a library function that takes them; older versions of the library take none."""
    kw: dict[str, Any] = {}
    params = _params(fn)
    if local > 1 and "local" in params:
        kw["local"] = local
    if "link_gbps" in params and os.environ.get("HVD_GRADQ_LINK_GBPS"):
        kw["link_gbps"] = float(os.environ["HVD_GRADQ_LINK_GBPS"])
    if "fallback" in params:  # the scheme's own bytes, as scale_worker sends them (no fp16 fallback)
        kw["fallback"] = False
    return kw


def _params(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _cost_per_host(spec: str, n: int, nd: int, nranks: int, local: int, p: Any) -> tuple[int, int]:
    """What the library's cost says one host's link carries for one tensor. ``cost(..., local=L)``
    is per host (its docstring); a library whose ``cost`` takes no ``local`` says what one rank
    moves, so the host's ranks are summed (L x)."""
    from hvd_gradq.plan.decide import cost, fp32_cost
    from hvd_gradq.plan.pattern import Pattern

    if p is Pattern.FP32:
        c = fp32_cost(n, nranks)  # Horovod's ring: one edge a host crosses the link each way
        return c.sent, c.received
    c = cost(_scheme(spec), n, nd, nranks, p, **_kw(cost, local))
    mult = 1 if _takes_local(cost) else local
    return mult * c.sent, mult * c.received


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ring_edge(nbytes: int, nranks: int) -> int:
    """Bytes one rank sends (and receives) in a ring allreduce of ``nbytes``."""
    return round(2 * (nranks - 1) / nranks * nbytes)


def baseline_model(spec: str, nranks: int, hosts: int) -> tuple[int, int]:
    """Horovod's ring in rank order: per host, one edge out and one in (none with one host)."""
    per = 4 if spec == "stock-fp32" else 2
    b = sum(ring_edge(per * _numel(s), nranks) for s in shapes()) if hosts > 1 else 0
    return b, b


def library_model(spec: str, requested: str, nranks: int, local: int) -> dict[str, Any]:
    """Per host: what ``patterns.cost`` says the host's link carries each way, over the model's
    tensors, each with the pattern ``patterns.decide`` picks (fp32: ``fp32_cost``)."""
    from hvd_gradq.plan.decide import decide
    from hvd_gradq.plan.pattern import Pattern

    scheme = _scheme(spec)
    sent = recv = 0
    used: dict[str, int] = {}
    for shape in shapes():
        n, nd = _numel(shape), len(shape)
        p = decide(scheme, n, nd, nranks, Pattern(requested), **_kw(decide, local)).pattern
        s, r = _cost_per_host(spec, n, nd, nranks, local, p)
        sent += s
        recv += r
        used[p.value] = used.get(p.value, 0) + 1
    return {"sent": sent, "received": recv, "patterns": used}


def wire_model(spec: str, requested: str, nranks: int, local: int, host: int) -> tuple[int, int]:
    """Per host: what crosses its link under Gloo's algorithms over the rank ring (rank r on host
    r // L): ring allreduce and ring allgatherv cross once a host, alltoallv directly, with every
    chunk's own size (the library's cost takes the largest chunk for each). Patterns it does not
    know (``hierarchical``) take the library's cost."""
    from hvd_gradq.plan.decide import decide
    from hvd_gradq.plan.layout import chunk_bounds, lanes_for
    from hvd_gradq.plan.pattern import Pattern
    from hvd_gradq.plan.second_phase import reduced_scheme
    from hvd_gradq.wire.payload import header_size

    scheme = _scheme(spec)
    hosts = nranks // local
    if hosts <= 1:
        return 0, 0
    mine = set(range(host * local, (host + 1) * local))
    nxt, first = ((host + 1) * local) % nranks, host * local
    sent = recv = 0
    for shape in shapes():
        n, nd = _numel(shape), len(shape)
        p = decide(scheme, n, nd, nranks, Pattern(requested), **_kw(decide, local)).pattern
        if p is Pattern.FP32:
            s = r = ring_edge(4 * n, nranks)
        elif p is Pattern.SUMMABLE:
            lanes = lanes_for(scheme.symbols, nranks).lanes(n)  # type: ignore[attr-defined]
            stats = 4 * -(-n // scheme.bucket) * scheme.meta_width  # type: ignore[attr-defined]
            s = r = ring_edge(4 * lanes + stats, nranks)
        elif p is Pattern.GATHER:
            s = r = (nranks - 1) * (header_size(scheme.spec, nd) + scheme.nbytes(n))
        elif p is Pattern.SCATTER:
            chunks = [hi - lo for lo, hi in chunk_bounds(n, scheme.bucket, nranks)]
            fine = reduced_scheme(scheme, nranks)
            sizes = [header_size(scheme.spec, 1) + scheme.nbytes(k) for k in chunks]
            reduced = [header_size(fine.spec, 1) + fine.nbytes(k) for k in chunks]
            s = local * sum(sizes[j] for j in range(nranks) if j not in mine) + sum(reduced) - reduced[nxt]
            r = (nranks - local) * sum(sizes[j] for j in mine) + sum(reduced) - reduced[first]
        else:
            s, r = _cost_per_host(spec, n, nd, nranks, local, p)
        sent += s
        recv += r
    return sent, recv


# ============================================================================== launcher


class _Progress:
    """``echo`` sink: one progress line (and a bar step) per finished entry; the rest to the log."""

    def __init__(self, bar: Any, log: Any, topo: str) -> None:
        self.bar, self.log, self.topo = bar, log, topo

    def write(self, s: str) -> int:
        self.log.write(s)
        for tag in ("[h0] ", "[r0] "):
            if s.startswith(tag + DONE + " "):
                self.bar.set_postfix_str(f"{self.topo} {s.split(DONE, 1)[1].strip()}"[:48])
                self.bar.update(1)
        return len(s)

    def flush(self) -> None:
        self.log.flush()


def _payload(c: netemu.HostCounters) -> tuple[int, int]:
    """TCP payload bytes a host sent and received: link bytes less every packet's headers."""
    return c.bytes_sent - HEADER_BYTES * c.packets_sent, c.bytes_recv - HEADER_BYTES * c.packets_recv


def run_topology(args: argparse.Namespace, topo: str, bar: Any, log: Any) -> dict[str, Any]:
    hosts, local = parse_topology(topo)
    nranks = hosts * local
    entries = entries_for(args.scheme_list, local, not args.no_baselines, args.pattern_list)
    gbps = netemu.parse_rate(args.rate) / 1e9
    os.environ["HVD_GRADQ_LINK_GBPS"] = f"{gbps:g}"  # the launcher's own decide() agrees with the ranks'
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(args.batch), "--seed", str(args.seed),
            "--idle", str(args.idle), "--entries", json.dumps([asdict(e) for e in entries])]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HVD_GRADQ_LINK_GBPS": f"{gbps:g}",
           # Gloo's 30 s default for one transfer is too short for 8 ranks sharing 2 cores
           "HOROVOD_GLOO_TIMEOUT_SECONDS": "600",
           "HVD_GRADQ_CACHE": os.environ.get("HVD_GRADQ_CACHE", str(Path.home() / ".cache" / "hvd_gradq"))}
    ncpu = os.cpu_count() or 1
    cpus = [str(r % ncpu) for r in range(nranks)] if args.pin else None
    load0 = os.getloadavg()
    with netemu.EmulatedCluster(hosts, rate=args.rate, ranks_per_host=local) as c:
        res = c.run(argv, env=env, timeout=args.timeout, cwd=str(ROOT), echo=_Progress(bar, log, topo), cpus=cpus)
    if not res.ok:
        raise SystemExit(f"bench_scale: topology {topo} failed: {res.error}\n{res.summary()}")
    outs: dict[int, dict[str, Any]] = {}
    for text in res.stdout:
        for line in text.splitlines():
            if line.startswith(TOKEN + " "):
                o = json.loads(line[len(TOKEN) + 1:])
                outs[o["rank"]] = o
    if sorted(outs) != list(range(nranks)):
        raise SystemExit(f"bench_scale: ranks {sorted(outs)} reported, expected {nranks}\n{res.summary()}")
    idle_s = res.seconds("idle.a", "idle.b")
    chatter = [tuple(b / idle_s for b in _payload(d)) for d in res.delta("idle.a", "idle.b")]  # B/s per host
    runs: dict[str, Any] = {}
    for i, e in enumerate(entries):
        steps = args.steps
        per_step = [max(outs[r]["runs"][e.label]["times"][k] for r in outs) for k in range(steps)]
        secs = res.seconds(f"s{i}.a", f"s{i}.b")
        deltas = res.delta(f"s{i}.a", f"s{i}.b")
        raw = [_payload(d) for d in deltas]
        meas_sent = [(s - chatter[h][0] * secs) / steps for h, (s, _) in enumerate(raw)]
        meas_recv = [(r - chatter[h][1] * secs) / steps for h, (_, r) in enumerate(raw)]
        row: dict[str, Any] = {
            **asdict(e), "step_s": statistics.median(per_step), "step_times": per_step, "phase_s": secs,
            "payload_sent": meas_sent, "payload_recv": meas_recv,
            "raw_payload_sent": [s / steps for s, _ in raw], "raw_payload_recv": [r / steps for _, r in raw],
            "retrans": [d.tcp_retrans for d in deltas],
        }
        if e.stock:
            row["model_sent"], row["model_recv"] = baseline_model(e.spec, nranks, hosts)
            row["wire_sent"], row["wire_recv"] = [row["model_sent"]] * hosts, [row["model_recv"]] * hosts
        else:
            lib = library_model(e.spec, e.pattern, nranks, local)
            row["model_sent"], row["model_recv"], row["model_patterns"] = lib["sent"], lib["received"], lib["patterns"]
            wires = [wire_model(e.spec, e.pattern, nranks, local, h) for h in range(hosts)]
            row["wire_sent"], row["wire_recv"] = [w[0] for w in wires], [w[1] for w in wires]
            row["patterns_used"] = [outs[r]["runs"][e.label].get("patterns", {}) for r in range(nranks)]
        runs[e.label] = row
    return {"topology": topo, "hosts": hosts, "local": local, "nranks": nranks, "rate": args.rate,
            "rate_bps": res.rate_bps, "chatter_Bps": chatter, "runs": runs, "load_start": load0,
            "load_end": os.getloadavg(), "elapsed_s": res.elapsed, "link_gbps_env": f"{gbps:g}",
            "takes_local": {f.__name__: _takes_local(f) for f in _lib_fns()}}


def _lib_fns() -> list[Callable[..., Any]]:
    from hvd_gradq.plan.decide import cost, decide, fp32_cost

    return [cost, decide, fp32_cost]


# ============================================================================== report


def _ratio(meas: list[float], model: float | list[float]) -> Optional[float]:
    """The per-host measured/model ratio furthest from 1 (None when the model is 0)."""
    models = model if isinstance(model, list) else [model] * len(meas)
    rs = [m / d for m, d in zip(meas, models) if d > 0]
    return max(rs, key=lambda r: abs(r - 1)) if rs else None


def _kb(b: float) -> str:
    return f"{b / 1e3:,.1f}"


def _fmt_ratio(r: Optional[float], raw: Optional[float] = None) -> str:
    if r is None:
        return "-"
    text = f"{r:.3f}" + ("" if abs(r - 1) <= RATIO_TOL else " **!**")
    return text + (f" ({raw:.3f})" if raw is not None else "")


def _auto_summary(rows: dict[str, Any], spec: str) -> Optional[dict[str, Any]]:
    """What ``auto`` used for ``spec`` and how its pattern's forced run compares with the fastest."""
    forced = {r["pattern"]: r for r in rows.values() if r["spec"] == spec and r["pattern"] not in ("", "auto")}
    auto = rows.get(f"{spec}@auto")
    if auto is None or not forced:
        return None
    used: dict[str, dict[str, int]] = {}
    for per_rank in auto["patterns_used"]:
        for p, c in per_rank.items():
            u = used.setdefault(p, {"tensors": 0, "sent": 0})
            u["tensors"] = max(u["tensors"], c["tensors"])
            u["sent"] += c["sent"]
    compressed = {p: u for p, u in used.items() if p != "fp32"} or used
    main = max(compressed, key=lambda p: compressed[p]["sent"]) if compressed else "?"
    best = min(forced, key=lambda p: forced[p]["step_s"])
    t_best = forced[best]["step_s"]
    t_main = forced[main]["step_s"] if main in forced else auto["step_s"]
    return {"used": used, "main": main, "best": best, "t_best": t_best, "t_main": t_main, "t_auto": auto["step_s"],
            "ok": main == best or t_main <= (1 + AUTO_TOL) * t_best,
            "agrees_with_model": {p: u["tensors"] for p, u in used.items()} == auto.get("model_patterns")}


def report(topos: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# The cost model on an emulated network (issue 16)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Load average (1, 5, 15 min) at start {tuple(round(x, 2) for x in meta['load_start'])}, "
        f"at end {tuple(round(x, 2) for x in meta['load_end'])}; {meta['cpus']} CPUs; "
        f"{meta['elapsed_s']:.0f} s in all. Raw results: `{meta['raw']}`.",
        "",
        f"Model: {len(shapes())} tensors, {sum(_numel(s) for s in shapes()):,} parameters "
        f"({_kb(4 * sum(_numel(s) for s in shapes()))} kB of fp32 gradient); {meta['steps']} timed steps after "
        f"{meta['warmup']} warm-up steps, batch {meta['batch']}. Bytes are TCP payload per host per step "
        "(link bytes less 66 B a packet, less the idle negotiation rate x the phase's time), the worst host's "
        "ratio shown, in brackets without the idle rate subtracted (the truth lies between: negotiation runs "
        "slower on a busy rank than idle); **!** marks a ratio off by more than 5%. "
        "Step time: slowest rank, median over the timed steps. "
        "*wire* is Gloo's algorithms over the rank ring (see `bench/scale/bench_scale.py`); it equals the model at one "
        "rank a host.",
        "",
    ]
    verdicts = []
    for t in topos:
        rows = t["runs"]
        lines += [f"## {t['hosts']} hosts x {t['local']} rank{'s' if t['local'] > 1 else ''} a host "
                  f"({t['nranks']} ranks, {t['rate']} links)", "",
                  f"Idle negotiation subtracted: {', '.join(_kb(s) for s, _ in t['chatter_Bps'])} kB/s sent per host; "
                  f"load {tuple(round(x, 2) for x in t['load_start'])} -> {tuple(round(x, 2) for x in t['load_end'])}; "
                  f"library takes `local=`: {t.get('takes_local')}.", "",
                  "| entry | patterns (tensors) | sent kB/host/step | model kB | ratio | recv kB | model kB | ratio "
                  "| wire ratio sent/recv | step ms |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, r in rows.items():
            ms = statistics.mean(r["payload_sent"])
            mr = statistics.mean(r["payload_recv"])
            pats = ", ".join(f"{p} {n}" for p, n in sorted((r.get("model_patterns") or {}).items())) or "ring"
            ws, wr = _ratio(r["payload_sent"], r["wire_sent"]), _ratio(r["payload_recv"], r["wire_recv"])
            rs, rr = _ratio(r["payload_sent"], r["model_sent"]), _ratio(r["payload_recv"], r["model_recv"])
            raw_s = _ratio(r.get("raw_payload_sent", []), r["model_sent"])
            raw_r = _ratio(r.get("raw_payload_recv", []), r["model_recv"])
            lines.append(
                f"| {label} | {pats} | {_kb(ms)} | {_kb(r['model_sent'])} | {_fmt_ratio(rs, raw_s)} "
                f"| {_kb(mr)} | {_kb(r['model_recv'])} | {_fmt_ratio(rr, raw_r)} "
                f"| {_fmt_ratio(ws)} / {_fmt_ratio(wr)} | {1e3 * r['step_s']:.1f} |")
        lines.append("")
        specs = list(dict.fromkeys(r["spec"] for r in rows.values() if not r["spec"].startswith("stock-")))
        auto_lines = []
        for spec in specs:
            a = _auto_summary(rows, spec)
            if a is None:
                continue
            used = ", ".join(f"{p}: {u['tensors']} tensors, {_kb(u['sent'] / t['nranks'])} kB a rank"
                             for p, u in sorted(a["used"].items()))
            ok = "yes" if a["ok"] else "**no**"
            auto_lines.append(
                f"| {spec} | {used} | {a['main']} ({1e3 * a['t_main']:.1f} ms) "
                f"| {a['best']} ({1e3 * a['t_best']:.1f} ms) "
                f"| {1e3 * a['t_auto']:.1f} | {ok} | {'yes' if a['agrees_with_model'] else 'no'} |")
            verdicts.append((t["topology"], spec, a["ok"]))
        if auto_lines:
            lines += ["| scheme | auto used (stats) | auto's pattern, forced | fastest forced | auto ms "
                      "| auto's pattern fastest or within 10% | same as model's decide |",
                      "|---|---|---|---|---:|---|---|", *auto_lines, ""]
    bad = [(t["topology"], label) for t in topos for label, r in t["runs"].items()
           for ratio in (_ratio(r["payload_sent"], r["model_sent"]), _ratio(r["payload_recv"], r["model_recv"]))
           if ratio is not None and abs(ratio - 1) > RATIO_TOL]
    lines += ["## Summary", "",
              f"- measured/model outside 5%: {len(set(bad))} of {sum(len(t['runs']) for t in topos)} runs"
              + (": " + ", ".join(f"{tp} {lb}" for tp, lb in sorted(set(bad))) if bad else ""),
              f"- auto's pattern the fastest or within 10%: {sum(ok for *_, ok in verdicts)} of {len(verdicts)}"
              + ("; not: " + ", ".join(f"{tp} {sp}" for tp, sp, ok in verdicts if not ok)
                 if not all(ok for *_, ok in verdicts) else ""),
              ""]
    if meta.get("figure"):
        lines += [f"![step time per entry per topology]({meta['figure']})", ""]
    return "\n".join(lines)


def plot(topos: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(topos), 1, figsize=(12, 3.2 * len(topos)), squeeze=False)
    for ax, t in zip(axes[:, 0], topos):
        labels = list(t["runs"])
        vals = [1e3 * t["runs"][lb]["step_s"] for lb in labels]
        colors = ["tab:gray" if t["runs"][lb]["spec"].startswith("stock-") else
                  "tab:green" if t["runs"][lb]["pattern"] == "auto" else "tab:blue" for lb in labels]
        ax.bar(range(len(labels)), vals, color=colors)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("step ms")
        ax.set_title(f"{t['hosts']} hosts x {t['local']} ranks, {t['rate']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(topos: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    fig = out.with_suffix(".png")
    try:
        plot(topos, fig)
        meta["figure"] = fig.name
    except Exception as e:  # a report without the plot beats none
        print(f"bench_scale: no plot ({e})", file=sys.stderr)
    out.write_text(report(topos, meta))
    print(out.read_text())
    print(f"bench_scale: wrote {out}" + (f" and {fig}" if meta.get("figure") else ""))


# ============================================================================== main


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topologies", default=DEFAULT_TOPOLOGIES, help="HOSTSxRANKS, comma-separated")
    ap.add_argument("--schemes", default=DEFAULT_SCHEMES, help="hvd_gradq specs, comma-separated")
    ap.add_argument("--patterns", default="", help="only these patterns, comma-separated (default: every one "
                    "the library offers that the scheme accepts, and auto)")
    ap.add_argument("--no-baselines", action="store_true", help="leave out Horovod's fp32 and fp16")
    ap.add_argument("--rate", default="1gbit", help="each link's rate, both ways (tc syntax)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps an entry")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle", type=float, default=2.0, help="seconds of the idle phase (negotiation rate)")
    ap.add_argument("--pin", action="store_true", help="pin rank r to CPU r %% cores (taskset)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a topology's launch may take")
    ap.add_argument("--out", default=str(ROOT / "results" / "scale" / "scale_emulated.md"))
    ap.add_argument("--from-json", default="", help="only rewrite the report from this raw results file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--entries", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw_path = out.with_suffix(".json")
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        _write(data["topologies"], data["meta"], out)
        return 0
    args.scheme_list = [s.strip() for s in args.schemes.split(",") if s.strip()]
    args.pattern_list = [s.strip() for s in args.patterns.split(",") if s.strip()]
    try:
        topos = [t.strip() for t in args.topologies.split(",") if t.strip()]
        for t in topos:
            parse_topology(t)
        for s in args.scheme_list:
            patterns_for(s, 2)
        netemu.parse_rate(args.rate)
    except Exception as e:
        print(f"bench_scale: {e}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.warmup < 0:
        print("bench_scale: --steps must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    try:
        netemu.preflight()
    except netemu.NetEmuError as e:
        print(f"bench_scale: {e}", file=sys.stderr)
        return 1
    from tqdm import tqdm

    given = list(sys.argv[1:] if argv is None else argv)
    meta: dict[str, Any] = {"command": " ".join(["sudo .venv/bin/python bench/scale/bench_scale.py", *given]),
                            "load_start": os.getloadavg(), "cpus": os.cpu_count(), "steps": args.steps,
                            "warmup": args.warmup, "batch": args.batch, "rate": args.rate,
                            "raw": os.path.relpath(raw_path, ROOT)}
    total = sum(len(entries_for(args.scheme_list, parse_topology(t)[1], not args.no_baselines, args.pattern_list))
                for t in topos)
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    log_path = ROOT / "results" / "raw" / f"{out.stem}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log, tqdm(total=total, desc="bench_scale", unit="run") as bar:
        for topo in topos:
            bar.set_description(f"bench_scale {topo}")
            results.append(run_topology(args, topo, bar, log))
            meta.update(load_end=os.getloadavg(), elapsed_s=time.monotonic() - t0)
            raw_path.write_text(json.dumps({"meta": meta, "topologies": results}, indent=1))
    print(f"bench_scale: measured in {time.monotonic() - t0:.0f} s (log: {log_path})")
    _write(results, meta, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
