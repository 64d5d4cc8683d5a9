"""The one error type users catch: every bad input raises a subclass of ``ValueError``."""
from __future__ import annotations


class GradqError(ValueError):
    """Bad input to hvd_gradq: the message says what was wrong and what is valid."""


class SpecError(GradqError):
    """A scheme name, parameter or value that cannot be used."""


class PayloadError(GradqError):
    """Bytes that are not a valid hvd_gradq payload (truncated, corrupt, wrong version)."""


class CorruptionError(PayloadError):
    """Bytes that arrived changed (a checksum that does not match what was sent): raised on every
    rank of the reduction, naming the tensor, the step, the rank that found it and the sender."""


class NonFiniteError(GradqError):
    """A gradient held NaN or Inf and the compressor was told to raise (``nonfinite=raise``)."""


class RangeError(GradqError):
    """A finite value the scheme cannot quantize: beyond ``Scheme.limit`` (its float32 arithmetic
    would overflow), a float64 beyond float32's range, or beyond fp16's range under
    ``fp16:overflow=raise``."""


class RankMismatchError(GradqError):
    """Ranks disagree on the compression configuration."""
