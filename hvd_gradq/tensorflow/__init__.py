"""TensorFlow frontend: Horovod compressors for ``horovod.tensorflow`` and ``horovod.tensorflow.keras``.

    import hvd_gradq.tensorflow as gq
    compression = gq.ORQ(levels=5)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=compression)

``gq.from_spec("orq:levels=5,ef=true")`` builds any scheme from a config string;
``gq.from_env()`` reads it from ``HVD_GRADQ``. The factories' and these functions' keywords are
the scheme's parameters and :class:`GradqCompressor`'s options
(:mod:`hvd_gradq.frontend.factory`); ``help(gq.ORQ)`` lists them. The compressor is a
``tf.Module``: pass it to ``tf.train.Checkpoint(compressor=compression, ...)`` to save
error-feedback residuals and the random streams' positions. See
:mod:`hvd_gradq.tensorflow.compressor` for how gradients are identified, where the state lives
and what crosses the wire.

Sparse gradients (``tf.IndexedSlices``, e.g. of an ``Embedding``) never reach a compressor:
Horovod allgathers their values and indices itself, uncompressed. Pass
``sparse_as_dense=True`` to Horovod to have them densified and compressed like the others.
"""
from __future__ import annotations

from typing import Any

from ..frontend.factory import ENV, SchemeFactory, check_options, install_factories, late_factory, with_options
from ..frontend.settings import env_settings, spec_settings
from ..frontend.versions import require_horovod
from .compressor import GradqCompressor
from .ops import TF, TFOps

require_horovod(__name__)  # the Horovod whose calling frames the call-site reader knows (frontend/versions.py)


def from_spec(spec: str, **options: Any) -> GradqCompressor:
    """A compressor for ``spec`` (e.g. ``"orq:levels=5,ef=true"``, and any compressor options
    after the scheme's: ``"orq:levels=3,pattern=scatter"``); ``options`` are
    :class:`GradqCompressor`'s (seed, pattern, link_gbps, name, ...)."""
    check_options(options, GradqCompressor, __name__, "from_spec()")
    config, given = spec_settings(spec, options, GradqCompressor, __name__)
    return GradqCompressor(config, **given)


def from_env(default: str | None = None, **options: Any) -> GradqCompressor:
    """A compressor for the ``HVD_GRADQ`` environment variable: a spec, then any compressor
    options (``HVD_GRADQ="orq:levels=3,pattern=scatter,link_gbps=1"``). Unset or empty:
    ``default``, or ``none`` (no compression) with a warning when no default is given. A bad
    line in the variable raises an error naming it; an option set there and here must agree."""
    check_options(options, GradqCompressor, __name__, "from_env()")
    config, given = env_settings(default, options, GradqCompressor, __name__)
    return GradqCompressor(config, **given)


with_options(from_spec, GradqCompressor)
with_options(from_env, GradqCompressor)

# The module's own names, a literal list so that linters and type checkers see the re-exports;
# then every scheme's factory (``ORQ``, ``QSGD``, ...), as each scheme declares it in its own file
# (hvd_gradq/schemes/: ``@register("orq", export="ORQ", ...)``), bound here as module attributes.
__all__ = ["ENV", "TF", "GradqCompressor", "TFOps", "from_env", "from_spec"]
__all__ += install_factories(globals(), GradqCompressor)


def __getattr__(name: str) -> SchemeFactory[GradqCompressor]:
    """The factory of a scheme registered after this module loaded (a plugin's). Also what a
    type checker reads for the factories bound above, which it cannot see (the package is
    typed): ``from hvd_gradq.tensorflow import ORQ`` checks as a SchemeFactory."""
    return late_factory(__name__, name, GradqCompressor)
