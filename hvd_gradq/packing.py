"""Re-export shim: the packing lives in :mod:`hvd_gradq.wire.packing` (kept for the TensorFlow
frontend and the tests, which import it from here)."""
from .wire.packing import Layout, check_codes, layout, pack, pack_bits, pack_lanes, unpack, unpack_bits, unpack_lanes

__all__ = [
    "Layout", "check_codes", "layout", "pack", "pack_bits", "pack_lanes", "unpack", "unpack_bits", "unpack_lanes",
]
