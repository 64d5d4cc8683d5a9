"""Workers' stand-in for a job without ``HVD_GRADQ_FIGURES=table``, which the harness pins so that
decisions are the same in every run: inside :func:`measuring` the CPU figures are still the
table's (nothing is timed), but the source is ``measure``, so a compressor's handshake measures
the link rate (hvd_gradq.frontend.link) as a user's job does."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from hvd_gradq.frontend import probe


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    real, probe.measure = probe.measure, lambda schemes, cast=None, **_: probe.table(schemes)
    os.environ[probe.FIGURES_ENV] = "measure"
    try:
        yield
    finally:
        probe.measure = real
        os.environ[probe.FIGURES_ENV] = "table"


def link_report(world: dict) -> dict:
    """What a rank says of its compressor's link, for :func:`trial_checks.check_link`."""
    return {"gbps": world["link_gbps"], "link": world["link"]}
