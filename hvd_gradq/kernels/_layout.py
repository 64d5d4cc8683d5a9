"""Layout ids shared by the dispatcher and the numba kernels (no numba import here)."""
from __future__ import annotations

L_GENERIC, L_B1, L_B2, L_B4, L_B8, L_S3, L_S5, L_S9 = 0, 1, 2, 3, 4, 5, 6, 7


def layout_id(s: int, g: int, bits: int) -> int:
    """Which specialised packing loop serves the layout (s symbols, g a word of ``bits``)."""
    if g == 1:
        return {1: L_B1, 2: L_B2, 4: L_B4, 8: L_B8}.get(bits, L_GENERIC)
    return {(3, 5, 8): L_S3, (5, 3, 7): L_S5, (9, 5, 16): L_S9}.get((s, g, bits), L_GENERIC)
