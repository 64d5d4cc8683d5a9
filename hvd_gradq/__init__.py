"""hvd_gradq: gradient quantization for Horovod, real on the wire.

Framework-free front (NumPy)::

    import hvd_gradq
    p = hvd_gradq.quantize(grad, "orq:levels=5", seed=0)
    p.nbytes                      # bytes that would cross the wire
    g = hvd_gradq.dequantize(p)   # same shape and dtype as grad
    hvd_gradq.Payload.from_bytes(p.to_bytes())

Frontends: ``hvd_gradq.torch`` and ``hvd_gradq.tensorflow`` (imported on demand, so this
package imports without either framework).
"""
from .api import Payload, dequantize, quantize
from .errors import CorruptionError, GradqError, NonFiniteError, PayloadError, RangeError, RankMismatchError, SpecError
from .spec import names, parse

__version__ = "0.1.0"
__all__ = [
    "CorruptionError",
    "GradqError",
    "NonFiniteError",
    "Payload",
    "PayloadError",
    "RangeError",
    "RankMismatchError",
    "SpecError",
    "dequantize",
    "names",
    "parse",
    "quantize",
]
