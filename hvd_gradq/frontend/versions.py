"""Which Horovod the frontends run on, checked when ``hvd_gradq.torch`` or ``hvd_gradq.tensorflow``
is imported (``import hvd_gradq`` itself needs neither framework nor Horovod).

Both frontends read what Horovod's call says (the parameter's name, the op, the scale factors,
the process set) from Horovod's own calling frames (:mod:`hvd_gradq.torch.callsite`,
:mod:`hvd_gradq.tensorflow.callsite`): local variable names of Horovod 0.28.1's
``DistributedOptimizer``, ``DistributedGradientTape`` and Keras optimizer. Another Horovod may name
them otherwise, and a misread frame would reduce a gradient with the wrong op or scale, silently.
So a version outside :data:`SUPPORTED` is refused at import with a message saying so; the
adventurous set ``HVD_GRADQ_UNSUPPORTED_HOROVOD=1`` and get a warning instead (the call-site
reader still refuses a frame it cannot read, but cannot tell one that moved).
"""
from __future__ import annotations

import os
import re
import warnings

from ..errors import GradqError

#: Horovod versions the frontends accept: at least the first, below the second. Tested: 0.28.1
#: (the last release of the 0.28 line; CPU, Gloo and MPI).
SUPPORTED = ((0, 28, 1), (0, 29))
TESTED = "0.28.1"
#: Set to 1 to import with another Horovod anyway (a warning instead of the refusal).
ENV = "HVD_GRADQ_UNSUPPORTED_HOROVOD"


def parse_version(text: str) -> tuple[int, ...] | None:
    """The release numbers of a version string (``"0.28.1+cu118"`` -> (0, 28, 1)); None if it has none."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def supported(version: str) -> bool:
    """Whether Horovod ``version`` is within :data:`SUPPORTED`."""
    v = parse_version(version)
    low, high = SUPPORTED
    return v is not None and low <= v < high


def check_horovod(version: str | None, frontend: str) -> None:
    """Refuse (GradqError) a Horovod ``version`` outside :data:`SUPPORTED` for ``frontend``
    (``hvd_gradq.torch``), or warn when :data:`ENV` is set."""
    if version is not None and supported(version):
        return
    low, high = (".".join(map(str, v)) for v in SUPPORTED)
    msg = (f"{frontend} supports Horovod >={low},<{high} (tested: {TESTED}); this is Horovod {version or '?'}. "
           "hvd_gradq reads the parameter name, op, scale factors and process set of each reduction from "
           f"Horovod {TESTED}'s own calling frames, which other versions may lay out otherwise (a misread frame "
           f"would reduce with the wrong op or scale). Install horovod=={TESTED} (README: Installing into an "
           f"existing environment), or set {ENV}=1 to import anyway at your own risk")
    if os.environ.get(ENV, "").strip() not in ("", "0"):
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        return
    raise GradqError(msg)


def require_horovod(frontend: str) -> None:
    """:func:`check_horovod` on the Horovod that is installed (its ``horovod.__version__``)."""
    import horovod

    check_horovod(getattr(horovod, "__version__", None), frontend)
