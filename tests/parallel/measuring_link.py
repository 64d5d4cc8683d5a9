"""Workers' stand-in for a job without ``HVD_GRADQ_FIGURES=table``, which the harness pins so that
decisions are the same in every run: :func:`measuring_with` turns measuring back on with a stand-in
for the CPU probe (nothing is timed); :func:`measuring` keeps the table's CPU figures, so that
only what measuring adds beside them runs, as in a user's job: the handshake measures the link
rate (hvd_gradq.frontend.link)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from hvd_gradq.frontend import probe
from hvd_gradq.plan.cpu_cost import Figures


@contextlib.contextmanager
def measuring_with(stand_in: Callable[..., Figures]) -> Iterator[None]:
    """Compressors built inside "measure" their CPU figures with ``stand_in`` (``probe.measure``'s
    signature) and measure the link; the harness's table is back after the block."""
    real, probe.measure = probe.measure, stand_in
    os.environ[probe.FIGURES_ENV] = "measure"
    try:
        yield
    finally:
        probe.measure = real
        os.environ[probe.FIGURES_ENV] = "table"


def measuring() -> contextlib.AbstractContextManager[None]:
    """:func:`measuring_with` the table's CPU figures."""
    return measuring_with(lambda schemes, cast=None, **_: probe.table(schemes))


def link_report(world: dict) -> dict:
    """What a rank says of its compressor's link, for :func:`trial_checks.check_link`."""
    return {"gbps": world["link_gbps"], "link": world["link"]}
