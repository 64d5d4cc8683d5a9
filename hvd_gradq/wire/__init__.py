"""Where bytes go on the wire: the one owner of every byte layout of hvd_gradq.

* :mod:`.packing`: symbols into bytes (base-s words), summable int32 lanes, fixed-width
  bitstreams (Top-K indices), in any :class:`~hvd_gradq.xp.Ops` namespace;
* :mod:`.payload`: the payload header (versioned, CRC-32 checked, the spec as text), its
  checksum, laying sections out and cutting them back;
* :mod:`.integrity`: the checksums of what is not a payload (the summable pattern's lanes and
  statistics, the hierarchical pattern's fp32 pieces), and where a gathered buffer is corrupt.

This package knows no scheme: it imports neither ``hvd_gradq.schemes`` nor ``hvd_gradq.spec``
(``tests/unit/test_wire_layer.py``). It takes whatever declares a spec text and its sections
(:class:`.payload.Codec`); turning spec text into a scheme is the decoder's step
(:mod:`hvd_gradq.api`). The compiled kernels' streamed packing loops
(``hvd_gradq.kernels._nb_pack``) lay the same bytes as :mod:`.packing`, bit for bit.
"""
from .packing import Layout, check_codes, layout, pack, pack_bits, pack_lanes, unpack, unpack_bits, unpack_lanes
from .payload import (
    CHECK_OFFSET,
    DTYPE_CODES,
    DTYPES,
    MAGIC,
    MAX_ELEMENTS,
    MAX_NDIM,
    VERSION,
    Codec,
    Header,
    Payload,
    SectionLike,
    checksum,
    crc32,
    cut,
    header_bytes,
    header_size,
    private_copy,
    read_header,
)

__all__ = [
    "CHECK_OFFSET",
    "DTYPES",
    "DTYPE_CODES",
    "MAGIC",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "VERSION",
    "Codec",
    "Header",
    "Layout",
    "Payload",
    "SectionLike",
    "check_codes",
    "checksum",
    "crc32",
    "cut",
    "header_bytes",
    "header_size",
    "layout",
    "pack",
    "pack_bits",
    "pack_lanes",
    "private_copy",
    "read_header",
    "unpack",
    "unpack_bits",
    "unpack_lanes",
]
