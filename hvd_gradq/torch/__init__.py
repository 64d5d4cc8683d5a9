"""PyTorch frontend: Horovod compressors for ``horovod.torch.DistributedOptimizer``.

    import hvd_gradq.torch as gq
    compression = gq.ORQ(levels=5, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)

``gq.from_spec("orq:levels=5,ef=true", named_parameters=...)`` builds any scheme from a config
string; ``gq.from_env(named_parameters=...)`` reads it from ``HVD_GRADQ``. The factories' and
these functions' keywords are the scheme's parameters and :class:`GradqCompressor`'s options
(:mod:`hvd_gradq.frontend.factory`); ``help(gq.ORQ)`` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..frontend.factory import ENV, SchemeFactory, check_options, install_factories, late_factory, with_options
from ..frontend.settings import env_settings, spec_settings
from ..frontend.versions import require_horovod
from .compressor import GradqCompressor

require_horovod(__name__)  # the Horovod whose calling frames the call-site reader knows (frontend/versions.py)

NamedParameters = Iterable[tuple[str, torch.nn.Parameter]]


def from_spec(spec: str, named_parameters: NamedParameters | None = None, **options: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``, and any compressor options
    after the scheme's: ``"orq:levels=3,pattern=scatter"``); ``options`` are
    :class:`GradqCompressor`'s (seed, pattern, link_gbps, threads, ...)."""
    check_options(options, GradqCompressor, __name__, "from_spec()")
    config, given = spec_settings(spec, options, GradqCompressor, __name__)
    return GradqCompressor(config, named_parameters, **given)


def from_env(
    named_parameters: NamedParameters | None = None, default: str | None = None, **options: Any
) -> GradqCompressor:
    """A compressor for the ``HVD_GRADQ`` environment variable: a spec, then any compressor
    options (``HVD_GRADQ="orq:levels=3,pattern=scatter,link_gbps=1"``). Unset or empty:
    ``default``, or ``none`` (no compression) with a warning when no default is given. A bad
    line in the variable raises an error naming it; an option set there and here must agree."""
    check_options(options, GradqCompressor, __name__, "from_env()")
    config, given = env_settings(default, options, GradqCompressor, __name__)
    return GradqCompressor(config, named_parameters, **given)


with_options(from_spec, GradqCompressor)
with_options(from_env, GradqCompressor)

# The module's own names, a literal list so that linters and type checkers see the re-exports;
# then every scheme's factory (``ORQ``, ``QSGD``, ...), as each scheme declares it in its own file
# (hvd_gradq/schemes/: ``@register("orq", export="ORQ", ...)``), bound here as module attributes;
# ``named_parameters`` positional or keyword: ``ORQ(named_parameters, levels=5)``.
__all__ = ["ENV", "GradqCompressor", "from_env", "from_spec"]
__all__ += install_factories(globals(), GradqCompressor)


def __getattr__(name: str) -> SchemeFactory[GradqCompressor]:
    """The factory of a scheme registered after this module loaded (a plugin's). Also what a
    type checker reads for the factories bound above, which it cannot see (the package is
    typed): ``from hvd_gradq.torch import ORQ`` checks as a SchemeFactory."""
    return late_factory(__name__, name, GradqCompressor)
