"""The ``hvd_gradq`` logger: one line when a compressor's first step is done, then nothing
unless asked: ``log_every=K`` (a compressor option, or ``HVD_GRADQ_LOG_EVERY``) adds the same
line every K steps on rank 0, ``HVD_GRADQ_LOG=debug`` one line a step on every rank.

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
from collections.abc import Callable
from typing import Any

from .errors import GradqError
from .reduce.report import heading, short_spec, size, times
from .reduce.stats import tally

NAME = "hvd_gradq"
ENV = "HVD_GRADQ_LOG"
#: The compressors' ``log_every`` when they are not given it (unset: 0, off).
EVERY_ENV = "HVD_GRADQ_LOG_EVERY"

__all__ = ["ENV", "EVERY_ENV", "NAME", "configure", "describe", "env_level", "first_step", "logger", "resolve_every",
           "short_spec", "step", "step_done", "wants_steps"]
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


def resolve_every(value: int | None = None) -> int:
    """The compressors' ``log_every``: ``value``, else ``HVD_GRADQ_LOG_EVERY``, else 0 (off): a
    whole number of steps; a GradqError saying what to write for anything else."""
    source: str = "log_every"
    if value is None:
        raw = os.environ.get(EVERY_ENV, "").strip()
        if not raw:
            return 0
        source = EVERY_ENV
        try:
            value = int(raw)
        except ValueError:
            raise GradqError(f"{EVERY_ENV}={raw!r} is not a step count: write a whole number, e.g. 100 "
                             "(0: off)") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GradqError(f"{source}={value!r} is not a step count: give a whole number >= 0, e.g. log_every=100 "
                         "(0: off)")
    return value


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


def trial_done(report: dict[str, Any], rank: int | None = None) -> None:
    """Log what a trial of ``auto``'s plans measured and took (:mod:`hvd_gradq.plan.trial`):
    each candidate's step, the cost model's seconds for its reductions beside it (and where the
    frontend measured it, what the reductions added after backward), the plan."""
    log = configure(0 if rank is None else rank)
    if not log.isEnabledFor(logging.INFO):
        return
    parts = []
    for plan, c in report["candidates"].items():
        measured = "-" if c["measured_s"] is None else f"{c['measured_s'] * 1e3:.1f} ms"
        notes = [f"{what} {c[k] * 1e3:.1f} ms" for k, what in (("model_s", "model"),
                                                               ("after_backward_s", "after backward"))
                 if c.get(k) is not None]
        model = f" ({'; '.join(notes)})" if notes else ""
        parts.append(f"{plan} {measured}{model}" + (f" [{c['skipped']}]" if c["skipped"] else ""))
    log.info(f"auto, trial {report['trials']}: a step took {'; '.join(parts)} -> plan {report['plan']}: "
             f"{report['why']}; trials so far cost {report['cost_s']:.3g} s, "
             f"{100 * report['cost_per_1000_steps']:.2g}% of 1,000 steps of the plan taken")


def step(summary: dict[str, Any], rank: int) -> None:
    """Log a step's figures at DEBUG (off unless asked: ``HVD_GRADQ_LOG=debug``)."""
    log = configure(rank)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(describe(summary, f"step {summary['steps']}"))


def wants_steps(rank: int) -> bool:
    """Whether :func:`step` would log anything (so a frontend builds no summary for nothing)."""
    return configure(rank).isEnabledFor(logging.DEBUG)


def step_done(number: int, rank: int, every: int, summary: Callable[[], dict[str, Any]],
              first: bool | None = None) -> None:
    """What a frontend calls once step ``number``'s figures are all in: the first-step line
    (``first``: by default step 1); the line every ``every`` steps (``log_every``, INFO: rank 0
    unless ``HVD_GRADQ_LOG`` says otherwise); else, with ``HVD_GRADQ_LOG=debug``, a line a step.
    ``summary`` (a ``stats()`` dict) is made only where a line is due."""
    log = configure(rank)
    if (number == 1) if first is None else first:
        if log.isEnabledFor(logging.INFO):
            first_step(summary(), rank)
        return
    level = logging.INFO if every and number % every == 0 else logging.DEBUG
    if log.isEnabledFor(level):
        log.log(level, describe(summary(), f"step {number}"))


def describe(summary: dict[str, Any], what: str) -> str:
    """One line: the configuration and where the ranks run (:func:`~.reduce.report.heading`),
    tensors by pattern and reason, the step's bytes against Horovod's fp32 and fp16 allreduce,
    and its time."""
    head = heading(summary, what)
    by = tally(summary["tensors"])
    parts = []
    for pattern, tags in sorted(by.items(), key=lambda kv: -sum(kv[1].values())):
        count = sum(tags.values())
        why = ", ".join(tag if len(tags) == 1 else f"{k} {tag}" for tag, k in sorted(tags.items(), key=lambda t: -t[1]))
        parts.append(f"{pattern} {count} ({why})")
    tensors = f"{sum(sum(t.values()) for t in by.values())} tensors: {', '.join(parts) or 'none'}"
    a = summary["last_step"]["all"]
    volume = (f"sent {size(a['sent'])}, Horovod's fp32 allreduce {size(a['fp32'])} "
              f"(x{a['vs_fp32_allreduce']:.3g}), fp16 {size(a['fp16'])} (x{a['vs_fp16_allreduce']:.3g})")
    return f"{head}; {tensors}; {volume}; time {times(summary)}"
