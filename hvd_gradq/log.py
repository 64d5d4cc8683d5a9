"""The ``hvd_gradq`` logger: one line when a compressor's first step is done, nothing per step
unless asked (``HVD_GRADQ_LOG=debug`` adds one line a step).

Libraries usually leave handlers to the application; a training job launched by ``horovodrun``
rarely configures :mod:`logging`, and then an INFO line would go nowhere (Python's last-resort
handler shows WARNING and above only). So when nobody has configured a handler for this logger
or any above it by the time the first line is due, :func:`configure` attaches one that writes to
``sys.stderr`` (whatever it is at the time, as Python's own last-resort handler does), at INFO
on rank 0 and WARNING on the other ranks: N ranks do not print N copies of the same summary.
``HVD_GRADQ_LOG`` = ``debug``, ``info``, ``warning`` or ``error`` sets the level on every rank,
whoever configured the handlers. An application that configures logging itself (``basicConfig``,
its own handlers) before the first step gets the records through propagation, at the levels it
chose, and no handler of ours.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .errors import GradqError
from .plan.pattern import duration
from .reduce.stats import tally
from .spec import parse

NAME = "hvd_gradq"
ENV = "HVD_GRADQ_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

logger = logging.getLogger(NAME)
_configured = False


def env_level() -> int | None:
    """The level ``HVD_GRADQ_LOG`` names, None when unset; a GradqError for anything else."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    level = LEVELS.get(raw.lower())
    if level is None:
        raise GradqError(f"{ENV}={raw!r} is not a log level; use one of {', '.join(LEVELS)}")
    return level


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stderr`` of the moment, as :data:`logging.lastResort` does (so a
    redirection made later is followed)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def configure(rank: int) -> logging.Logger:
    """The logger, set up once per process (see the module docstring); ``rank`` is this
    process's rank among all of Horovod's."""
    global _configured
    if not _configured:
        _configured = True
        level = env_level()
        if not logger.hasHandlers():
            handler = _Stderr()
            handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(level if level is not None else logging.INFO if rank == 0 else logging.WARNING)
        elif level is not None:
            logger.setLevel(level)
    return logger


def first_step(summary: dict[str, Any], rank: int) -> None:
    """Log the line that sums up a compressor's first step (:meth:`~.reduce.stats.Stats.summary`)."""
    log = configure(rank)
    if log.isEnabledFor(logging.INFO):
        log.info(describe(summary, "first step") + " (with any one-time kernel compiling)")


def step(summary: dict[str, Any], rank: int) -> None:
    """Log a step's figures at DEBUG (off unless asked: ``HVD_GRADQ_LOG=debug``)."""
    log = configure(rank)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(describe(summary, f"step {summary['steps']}"))


def wants_steps(rank: int) -> bool:
    """Whether :func:`step` would log anything (so a frontend builds no summary for nothing)."""
    return configure(rank).isEnabledFor(logging.DEBUG)


#: How the log names each kind of time (:data:`hvd_gradq.reduce.stats.KINDS`).
TIME_LABELS = {"encode_s": "encode", "wait_s": "wait", "decode_s": "decode", "compressor_s": "in compress/decompress"}


def describe(summary: dict[str, Any], what: str) -> str:
    """One line: the configuration, tensors by pattern and reason, the step's bytes against
    Horovod's fp32 and fp16 allreduce, and its time."""
    w = summary["world"]
    head = (f"{what}: {short_spec(w.get('scheme', '?'))} (pattern={w.get('pattern', '?')}) on "
            f"{w.get('ranks', '?')} ranks, {w.get('ranks_a_host', 1)} a host, cost model at "
            f"{w.get('link_gbps', 0):g} Gbit/s")
    by = tally(summary["tensors"])
    parts = []
    for pattern, tags in sorted(by.items(), key=lambda kv: -sum(kv[1].values())):
        count = sum(tags.values())
        why = ", ".join(tag if len(tags) == 1 else f"{k} {tag}" for tag, k in sorted(tags.items(), key=lambda t: -t[1]))
        parts.append(f"{pattern} {count} ({why})")
    tensors = f"{sum(sum(t.values()) for t in by.values())} tensors: {', '.join(parts) or 'none'}"
    a = summary["last_step"]["all"]
    volume = (f"sent {_size(a['sent'])}, Horovod's fp32 allreduce {_size(a['fp32'])} "
              f"(x{a['vs_fp32_allreduce']:.3g}), fp16 {_size(a['fp16'])} (x{a['vs_fp16_allreduce']:.3g})")
    times = ", ".join(f"{TIME_LABELS.get(k, k)} {duration(s)}" for k, s in summary["time"]["last_step"].items())
    if not any(summary["time"]["total"].values()):  # e.g. TensorFlow's summable pattern: graph ops only
        times = "none measured"
    return f"{head}; {tensors}; {volume}; time {times}"


def short_spec(spec: str) -> str:
    """``spec`` with only the parameters that differ from the scheme's defaults (``orq:levels=3``:
    the canonical text, :attr:`hvd_gradq.spec.Config.spec`); unchanged if it does not parse."""
    try:
        return parse(spec).spec
    except GradqError:
        return spec


def _size(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"
