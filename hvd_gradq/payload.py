"""Re-export shim: the wire format lives in :mod:`hvd_gradq.wire.payload`, and the payload
bound to a parsed scheme (``Payload.from_bytes``, ``split``) in :mod:`hvd_gradq.api` (kept for
the TensorFlow frontend and the tests, which import them from here)."""
from .api import Payload, parse_one, split
from .wire.payload import (
    CHECK_MODULUS,
    CHECK_OFFSET,
    DTYPE_CODES,
    DTYPES,
    MAGIC,
    MAX_ELEMENTS,
    MAX_NDIM,
    VERSION,
    checksum,
    header_bytes,
    header_size,
)

__all__ = [
    "CHECK_MODULUS",
    "CHECK_OFFSET",
    "DTYPES",
    "DTYPE_CODES",
    "MAGIC",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "VERSION",
    "Payload",
    "checksum",
    "header_bytes",
    "header_size",
    "parse_one",
    "split",
]
