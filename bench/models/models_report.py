"""The model benchmark's arithmetic and report: throughput from a launch's raw result, the line a
rank prints, the progress line a run gets, and the Markdown of ``results/models/<name>.md``.
Pure Python (no framework), so the worker, the launcher and the tests share one definition."""
from __future__ import annotations

from typing import Any

from bench.models import catalog


def throughput(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per compression: samples a second of both ranks together over all rounds (``per_s``: all
    samples / all time, so a slow round weighs by its time), the slowest and fastest round, and the
    ratios to Horovod fp16 and fp32 where the list has them."""
    per_block = result["batch"] * result["size"] * result["steps"]
    rows: dict[str, dict[str, Any]] = {}
    for spec, c in result["compressions"].items():
        blocks = c["block_s"]
        rounds = [per_block / b for b in blocks]
        rows[spec] = {"per_s": per_block * len(blocks) / sum(blocks), "min": min(rounds), "max": max(rounds),
                      "ranks_equal": c["ranks_equal"], "bytes_vs_fp32": c.get("bytes_vs_fp32"),
                      "compressor_s": c.get("compressor_s_a_step")}
    for row in rows.values():
        for base in ("fp16", "fp32"):
            ref = rows.get(base)
            row[f"vs_{base}"] = row["per_s"] / ref["per_s"] if ref else None
    return rows


def _ratio(x: float | None) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def summary_line(spec: str, row: dict[str, Any], unit: str) -> str:
    """What the worker prints for one compression."""
    eq = "" if row["ranks_equal"] else "  RANKS DIFFER"
    return (f"{spec:>24}: {row['per_s']:8.1f} {unit}/s (rounds {row['min']:.1f}-{row['max']:.1f}), "
            f"{_ratio(row['vs_fp16'])} Horovod fp16{eq}")


def progress_line(run: dict[str, Any]) -> str:
    """One line for a finished run: each compression's throughput and ratio to fp16."""
    if "error" in run:
        return f"FAILED: {run['error'][:200]}"
    unit = run["result"]["unit"]
    parts = [f"{spec} {row['per_s']:.1f} ({_ratio(row['vs_fp16'])})" for spec, row in throughput(run["result"]).items()]
    bad = [s for s, row in throughput(run["result"]).items() if not row["ranks_equal"]]
    return f"{unit}/s " + ", ".join(parts) + (f"; RANKS DIFFER: {bad}" if bad else "")


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


UNITS = {"img": "images", "seq": "sequences", "sample": "samples"}


def _load(la: list[float]) -> str:
    return "/".join(f"{x:.1f}" for x in la)


def _threads(r: dict[str, Any]) -> str:
    omp = r["omp_num_threads"]
    got = ", ".join(f"{k} {v}" for k, v in r["threads"].items())
    return f"OMP_NUM_THREADS={omp if omp is not None else 'unset'}; {got}"


def link_title(link: str) -> str:
    return "loopback (unlimited)" if link == "loopback" else link


def thread_title(threads: str) -> str:
    return "default threads" if threads == "default" else f"OMP_NUM_THREADS={threads}"


def markdown(doc: dict[str, Any]) -> str:
    """The report: ``doc`` holds the command, date, machine, load averages, the model's settings
    and ``runs`` (each: link, threads, load before/after, seconds, and the worker's ``result`` or an
    ``error``)."""
    info = catalog.MODELS[doc["model"]]
    ok = [r for r in doc["runs"] if "result" in r]
    first = ok[0]["result"] if ok else None
    fw = {"torch": "PyTorch, `hvd.DistributedOptimizer`", "tf": "TensorFlow, `hvd.DistributedGradientTape`"}
    lines = [f"# {info.title} ({fw[doc['framework']]}): throughput against Horovod fp32 and fp16", ""]
    if doc.get("note"):
        lines += [f"**{doc['note']}**", ""]
    lines += [f"Date: {doc['date']}. Machine: {doc['machine']}. Load average (1/5/15 min) before: "
              f"{_load(doc['load_before'])}, after: {_load(doc['load_after'])}.", "",
              f"Command: `{doc['command']}`", ""]
    if first is not None:
        shape = {"cnn": f"{first['image']}x{first['image']} images", "vector": f"{catalog.MLP_WIDTH} features",
                 "text": f"{first['seq']} tokens a sequence, {first['layers']} encoder layers"}[info.kind]
        lines += [
            f"Model: {info.title}, {first['params']:,} parameters in {first['tensors']} tensors "
            f"({first['params'] * 4 / 1e6:.1f} MB of fp32 gradient); batch {first['batch']} a rank, {shape}; "
            f"{first['size']} ranks; SGD with momentum 0.9, synthetic data (fixed seed, each rank its own batch).",
            "",
            f"Timing: every compression in the same launch, its own copy of the model (equal weights, broadcast "
            f"from rank 0): {_n(first['warmup'], 'warm-up step')} each, then {_n(first['rounds'], 'round')} of "
            f"{_n(first['steps'], 'timed step')} for each compression in turn. A block's time is the slowest rank's; "
            f"throughput = the {UNITS[info.unit]} of all ranks over all rounds / their time (in brackets: the slowest "
            "and fastest round). **vs fp16** is the ratio to Horovod's `Compression.fp16` in the same launch. "
            "**bytes vs fp32**: how many times fewer bytes than Horovod's fp32 allreduce the compressor says it "
            "sent (`stats()`). **compressor ms a step**: seconds a timed step inside hvd_gradq's `compress()` / "
            "`decompress()` (`stats()`), the rank with the most. **ranks equal**: every rank ended with bitwise the "
            "same weights.",
            "",
            "Links: **loopback** is `horovodrun --gloo -np 2` on this host (Gloo over TCP on loopback, no limit); "
            "**100mbit** and **1gbit** are 2 emulated hosts (`bench/netemu/`: network namespaces, each link "
            "shaped by `tc tbf` both ways), one rank each, "
            + ("`HVD_GRADQ_LINK_GBPS` set to the rate" if doc.get("link_rate", "given") == "given" else
               "the link rate measured by `auto` at its first step, as in a user's job (each compressor's "
               "figure below its launch's table)") + ". Threads: "
            "**default** leaves `OMP_NUM_THREADS` unset, the frameworks' defaults.",
            "",
        ]
    lines += _summary(doc["runs"])
    for run in doc["runs"]:
        lines += _run_section(run, info.unit)
    return "\n".join(lines).rstrip() + "\n"


def _summary(runs: list[dict[str, Any]]) -> list[str]:
    ok = [r for r in runs if "result" in r]
    if not ok:
        return []
    specs = list(dict.fromkeys(s for r in ok for s in r["result"]["compressions"]))
    head = [f"{link_title(r['link'])}, {thread_title(r['threads'])}" for r in ok]
    lines = ["## Throughput / Horovod fp16's", "", "| compression | " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(ok)]
    tables = [throughput(r["result"]) for r in ok]
    for s in specs:
        lines.append(f"| {s} | " + " | ".join(_ratio(t[s]["vs_fp16"]) if s in t else "-" for t in tables) + " |")
    return [*lines, ""]


def _run_section(run: dict[str, Any], unit: str) -> list[str]:
    lines = [f"## {link_title(run['link'])}, {thread_title(run['threads'])}", ""]
    if "error" in run:
        return [*lines, f"Failed: {run['error']}", ""]
    r = run["result"]
    lines += [f"{_threads(r)}. Load average before: {_load(run['load_before'])}, after: "
              f"{_load(run['load_after'])}. Launch: {run['seconds']:.0f} s (set-up and warm-up {r['setup_s']:.0f} s).",
              "", f"| compression | {unit}/s (rounds) | vs fp16 | vs fp32 | bytes vs fp32 | compressor ms a step | "
              "ranks equal |", "|---|---:|---:|---:|---:|---:|---|"]
    for spec, row in throughput(r).items():
        b, c = row["bytes_vs_fp32"], row.get("compressor_s")
        lines.append(f"| {spec} | {row['per_s']:.1f} ({row['min']:.1f}-{row['max']:.1f}) | {_ratio(row['vs_fp16'])} "
                     f"| {_ratio(row['vs_fp32'])} | {_ratio(b)} | {'-' if c is None else f'{1e3 * c:.0f}'} "
                     f"| {'yes' if row['ranks_equal'] else '**NO**'} |")
    links = [f"{spec}: {c['link']}" for spec, c in r["compressions"].items() if c.get("link")]
    if links:
        lines += ["", "The link rate each compressor's cost model priced with (`stats()['world']`): " + "; ".join(links)
                  + "."]
    return [*lines, "", *_auto_section(r)]


def fixed_of(spec: str) -> str:
    """The entry that runs ``spec``'s scheme as a fixed plan: the cost model's patterns, never
    handed to Horovod (``fallback=false``)."""
    return f"{spec},fallback=false" if ":" in spec else f"{spec}:fallback=false"


def auto_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per compression that measured its plans (``auto`` in the raw result): the plan it took,
    its throughput against the best fixed plan of the launch (Horovod's fp32 and fp16, and the
    scheme's own patterns as ``fallback=false`` where the list has it), and what its first trial
    cost against 1,000 steps of the plan it took (the trial ran before the timed rounds)."""
    rows = throughput(result)
    out = []
    for spec, c in result["compressions"].items():
        auto = c.get("auto")
        if not auto:
            continue
        fixed = {k: rows[k]["per_s"] for k in ("fp32", "fp16", fixed_of(spec)) if k in rows}
        best = max(fixed, key=lambda k: fixed[k]) if fixed else None
        step_s = sum(c["block_s"]) / (len(c["block_s"]) * result["steps"])
        out.append({"spec": spec, "plan": auto["plan"], "vs_best": rows[spec]["per_s"] / fixed[best] if best else None,
                    "best": best, "trial_steps": c.get("trial_steps"), "cost_s": auto["cost_s"],
                    "cost_1000": auto["cost_s"] / (1000 * step_s), "candidates": auto["candidates"],
                    "why": auto["why"]})
    return out


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.0f} ms"


def _auto_section(r: dict[str, Any]) -> list[str]:
    rows = auto_rows(r)
    if not rows:
        return []
    lines = ["Measured `auto` (`stats()['auto']`, after its first trial): the plan it took, its throughput "
             "against the best fixed plan of this launch, the trial's steps and cost against 1,000 steps of "
             "the plan taken, each candidate's median step in the trial (the cost model's seconds for its "
             "reductions in brackets).", "",
             "| compression | plan | vs best fixed | trial steps | trial cost / 1,000 steps | candidates |",
             "|---|---|---:|---:|---:|---|"]
    for a in rows:
        cands = "; ".join(f"{p} {_ms(c['measured_s'])}" + ("" if c["model_s"] is None else f" ({_ms(c['model_s'])})")
                          for p, c in a["candidates"].items())
        vs = "-" if a["vs_best"] is None else f"{a['vs_best']:.2f}x {a['best']}"
        lines.append(f"| {a['spec']} | {a['plan']} | {vs} | {a['trial_steps']} | {100 * a['cost_1000']:.2f}% "
                     f"| {cands} |")
    return [*lines, ""]
