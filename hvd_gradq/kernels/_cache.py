"""numba's on-disk cache of this package's kernels, dropped as a whole when any kernel source changes.

numba keys a cached function on the stamp of its own source file only. A kernel that calls a
function from another file links that callee into its own cached machine code, so after the
callee's file changes it keeps running the old callee: ``_nb_table.sorted_encode`` kept an old
:mod:`.orq_levels` search when only ``orq_levels.py`` had changed, and the fused encoder stopped
matching the reference's levels. So the kernel sources are hashed together, and when the hash
differs from the one stored beside the cache, every cached kernel of the package is deleted
before numba loads any (numba recompiles them on first use). Ranks starting together may race
here; numba treats a cache file removed under it as a miss, so the worst case is a compile.
A read-only install (no writable ``__pycache__``) is left alone: numba then caches elsewhere
or not at all.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_STAMP = "hvd_gradq_kernels.sha256"


def sources_hash() -> str:
    """SHA-256 over every kernel source file of the package, in name order."""
    h = hashlib.sha256()
    for src in sorted(_HERE.glob("*.py")):
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()


def refresh() -> None:
    """Delete the cached kernels if they were compiled from other sources than these."""
    cache = _HERE / "__pycache__"
    stamp = cache / _STAMP
    digest = sources_hash()
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        tmp = cache / f"{_STAMP}.{os.getpid()}.tmp"
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:
        pass
