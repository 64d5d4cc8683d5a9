"""What compression cost, as text a person reads: ``compression.summary()`` and the log's words.

``stats()`` (:meth:`hvd_gradq.reduce.stats.Stats.summary`) is everything, nested, for a program;
a person printing it at the end of a job wants a few lines: where the job ran, per pattern the
tensors and elements it carried, the bytes a step against Horovod's fp32 and fp16 allreduce and
why those tensors went that way, then the time a step by kind. :func:`table` writes those lines
from the same summary dict, for both frontends (their compressors' ``summary()``:
:class:`~.stats.Reports`), and :mod:`hvd_gradq.log` words its lines with the helpers here, so
that the log and the table say the same thing the same way.
"""
from __future__ import annotations

from typing import Any

from ..errors import GradqError
from ..plan.pattern import duration, why_tag
from ..spec import parse

#: How each kind of time is named (``stats()["time"]`` keys); ``compressor`` by frontend, since
#: TensorFlow's compress()/decompress() run once, while Horovod traces: there it is the time of
#: the compressor's host functions (:mod:`hvd_gradq.tensorflow.telemetry`).
TIME_LABELS = {"encode_s": "encode", "wait_s": "wait", "decode_s": "decode", "compressor_s": "in compress/decompress"}
COMPRESSOR_LABELS = {"tensorflow": "in its host functions"}


def time_label(key: str, frontend: str | None = None) -> str:
    """The words for a time key of ``stats()`` (``encode_s``) in ``frontend``'s reports."""
    if key == "compressor_s" and frontend in COMPRESSOR_LABELS:
        return COMPRESSOR_LABELS[frontend]
    return TIME_LABELS.get(key, key)


def size(b: float) -> str:
    """Bytes, short: ``35.6 kB``, ``80 B``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def short_spec(spec: str) -> str:
    """``spec`` with only the parameters that differ from the scheme's defaults (``orq:levels=3``:
    the canonical text, :attr:`hvd_gradq.spec.Config.spec`); unchanged if it does not parse."""
    try:
        return parse(spec).spec
    except GradqError:
        return spec


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def placement(world: dict[str, Any]) -> str:
    """Where the ranks run, as a user counts them (``2 ranks on 1 host``, ``8 ranks on 2 hosts
    of 4``), then the cost model's view, which may differ: it prices a single host, or hosts
    that are not alike, as one rank a host (:func:`hvd_gradq.plan.hosts.ranks_per_host`).
    ``hosts`` in ``world`` is None where Horovod cannot say (hosts not alike)."""
    ranks, hosts, local = world.get("ranks"), world.get("hosts"), world.get("ranks_a_host", 1)
    if ranks is None:
        where = "ranks not known (Horovod not initialized)"
    elif "hosts" not in world:  # a summary from before hosts were counted
        where = _count(ranks, "rank")
    elif hosts is None:
        where = _count(ranks, "rank") + " on hosts not alike"
    elif hosts == 1 or ranks == hosts:
        where = f"{_count(ranks, 'rank')} on {_count(hosts, 'host')}"
    else:
        where = f"{_count(ranks, 'rank')} on {hosts} hosts of {ranks // hosts}"
    measured = " (measured)" if str(world.get("link", "")).startswith("measured") else ""
    return f"{where}; cost model: {world.get('link_gbps', 0):.3g} Gbit/s{measured}, {_count(local, 'rank')} a host"


def heading(summary: dict[str, Any], what: str) -> str:
    """``what: orq (pattern=auto), 2 ranks on 1 host; cost model: 10 Gbit/s, 1 rank a host``,
    and what to set where the framework's threads oversubscribe the rank's cores (:func:`crowding`)."""
    w = summary["world"]
    return (f"{what}: {short_spec(w.get('scheme', '?'))} (pattern={w.get('pattern', '?')}), {placement(w)}"
            + crowding(w))


#: how a user sets the intra-op threads of each frontend's framework
_SET_THREADS = {
    "torch": "OMP_NUM_THREADS={n} in each rank's environment (or torch.set_num_threads({n}) before training)",
    "tensorflow": "TF_NUM_INTRAOP_THREADS={n} in each rank's environment (or "
                  "tf.config.threading.set_intra_op_parallelism_threads({n}) before any op runs)",
}


def crowding(world: dict[str, Any]) -> str:
    """``; oversubscribed: ...`` where the framework's intra-op threads exceed this rank's share
    of its host's cores (every rank of the host runs that many, so its parallel regions wait for
    time slices: PyTorch's default of all cores a process made a ResNet-18 step 2.5x slower at 2
    ranks on 2 cores), with what to set; else nothing. hvd_gradq's own work keeps to the share."""
    threads, share = world.get("intra_op_threads"), world.get("rank_cores")
    if not threads or not share or threads <= share:
        return ""
    how = _SET_THREADS.get(str(world.get("frontend")), "the framework's intra-op threads to {n}").format(n=share)
    return (f"; oversubscribed: {world.get('frontend')} runs {threads} intra-op threads in each rank, this rank's "
            f"share of the host's cores is {share}: set {how}")


def times(summary: dict[str, Any], which: str = "last_step", per: int = 1) -> str:
    """The time by kind of ``which`` (``last_step`` or ``total``, divided by ``per`` steps), or
    ``none measured`` where the frontend timed nothing (TensorFlow's summable pattern: graph ops)."""
    if not any(summary["time"]["total"].values()):
        return "none measured"
    frontend = summary["world"].get("frontend")
    return ", ".join(f"{time_label(k, frontend)} {duration(s / max(per, 1))}"
                     for k, s in summary["time"][which].items())


def _why(tensors: list[dict[str, Any]]) -> str:
    tags: dict[str, int] = {}
    for t in tensors:
        tags[why_tag(t["why"])] = tags.get(why_tag(t["why"]), 0) + 1
    return ", ".join(f"{tag} {k}" for tag, k in sorted(tags.items(), key=lambda kv: -kv[1]))


def _row(name: str, counts: dict[str, Any], elements: int, why: str) -> list[str]:
    return [name, f"{counts['tensors']}", f"{elements:,}", size(counts["sent"]),
            f"{size(counts['fp32'])} (x{counts['vs_fp32_allreduce']:.3g})",
            f"{size(counts['fp16'])} (x{counts['vs_fp16_allreduce']:.3g})", why]


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def table(summary: dict[str, Any]) -> str:
    """A short text table of a ``stats()`` summary (``compression.summary()``): a heading line
    (scheme, where the ranks run, the cost model's view, steps), per pattern the last step's
    tensors, elements, bytes sent and what Horovod's fp32 and fp16 allreduce would send (with
    how many times fewer this is) and the reasons' tags, then the time a step by kind (last
    step, and the mean over all steps) and the bytes in total."""
    steps = summary["steps"]
    by: dict[str, list[dict[str, Any]]] = {}
    for t in summary["tensors"].values():
        by.setdefault(t["pattern"], []).append(t)
    last = summary["last_step"]
    rows = [["pattern", "tensors", "elements", "sent", "fp32 allreduce", "fp16 allreduce", "why"]]
    patterns = sorted((p for p in last if p != "all"), key=lambda p: -sum(t["elements"] for t in by.get(p, [])))
    for pattern in patterns:  # the most elements first
        members = by.get(pattern, [])
        rows.append(_row(pattern, last[pattern], sum(t["elements"] for t in members), _why(members)))
    rows.append(_row("all", last["all"], sum(t["elements"] for t in summary["tensors"].values()), ""))
    total = summary["total"]["all"]
    lines = [heading(summary, "hvd_gradq") + f"; {_count(steps, 'step')}", "bytes a rank sent, last step:",
             *("  " + line for line in _columns(rows)),
             f"time, last step: {times(summary)}",
             f"time, mean a step over {_count(steps, 'step')} (the first's one-time compiling included): "
             f"{times(summary, 'total', steps)}",
             f"in total: sent {size(total['sent'])}, Horovod's fp32 allreduce {size(total['fp32'])} "
             f"(x{total['vs_fp32_allreduce']:.3g}), fp16 {size(total['fp16'])} (x{total['vs_fp16_allreduce']:.3g})"]
    if len(rows) == 2:  # nothing reduced yet: the header and 'all'
        lines[2:4] = ["  no tensor reduced yet"]
    return "\n".join(lines)
