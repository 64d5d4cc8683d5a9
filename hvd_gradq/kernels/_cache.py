"""Where numba caches this package's kernels, and dropping that cache when any kernel source changes.

**Where.** numba compiles a kernel at its first call (seconds each: 70 s of CPU for every kernel
on the project's machine) and keeps the machine code on disk, by default in a ``__pycache__``
beside the source. An installed wheel or a read-only image has no writable package folder, and
numba's own fallback is a directory named after numba, not this package. :func:`cache_dir`
picks, in order: ``$HVD_GRADQ_CACHE_DIR``; ``$NUMBA_CACHE_DIR`` (the user's numba setting, kept);
the package's own ``kernels/__pycache__`` when it is writable (a source checkout, an editable
install); ``$XDG_CACHE_HOME/hvd_gradq/numba`` or ``~/.cache/hvd_gradq/numba``; last, a folder of
this user under the system's temporary directory. Outside the package folder the kernels go
into a subfolder named after the package's path (``kernels_<hash>``), so two installs sharing a
cache directory do not drop each other's kernels. :mod:`._nb_cache` makes numba use it.

numba reads ``NUMBA_CACHE_DIR`` once, when numba is imported, and consults it when a function
is decorated with ``cache=True`` (that is when its cache locator is chosen); setting the
variable from here would come too late whenever numba was imported first, and would move every
other library's numba cache as well. So the directory is given to numba per function, through
a cache locator that answers only for this package's kernel files.

**When dropped.** numba keys a cached function on the stamp of its own source file only. A
kernel that calls a function from another file links that callee into its own cached machine
code, so after the callee's file changes it keeps running the old callee: ``_nb_table.
sorted_encode`` kept an old :mod:`.orq_levels` search when only ``orq_levels.py`` had changed,
and the fused encoder stopped matching the reference's levels. So the kernel sources are hashed
together, and when the hash differs from the one stored in the cache directory, every cached
kernel there is deleted before numba loads any (numba recompiles them on first use). Ranks
starting together may race here; numba treats a cache file removed under it as a miss, so the
worst case is a compile.

This module does not import numba: ``scripts/setup.sh`` and ``python -m hvd_gradq warm`` read
:func:`sources_hash` and :func:`cache_dir` without compiling anything.
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_STAMP = "hvd_gradq_kernels.sha256"
#: the variable that names the cache directory, above every other choice
ENV = "HVD_GRADQ_CACHE_DIR"


def sources_hash() -> str:
    """SHA-256 over every kernel source file of the package, in name order."""
    h = hashlib.sha256()
    for src in sorted(_HERE.glob("*.py")):
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()


def _writable(d: Path) -> bool:
    """Whether ``d`` exists or can be made, and a file can be written in it (numba's own test:
    permissions alone do not say, e.g. for root on a read-only mount)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=d).close()
    except OSError:
        return False
    return True


def _subdir() -> str:
    """The subfolder of a shared cache directory that holds this installation's kernels."""
    return "kernels_" + hashlib.sha1(str(_HERE).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def cache_dir() -> Path:
    """The directory numba keeps this package's compiled kernels in (see the module docstring
    for the order of choices); read once a process."""
    for var in (ENV, "NUMBA_CACHE_DIR"):
        if os.environ.get(var, "").strip():
            return Path(os.environ[var].strip()).expanduser() / _subdir()
    in_tree = _HERE / "__pycache__"
    if _writable(in_tree):
        return in_tree
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    user = (Path(xdg) if xdg else Path.home() / ".cache") / "hvd_gradq" / "numba" / _subdir()
    if _writable(user):
        return user
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"hvd_gradq-{uid}" / "numba" / _subdir()


def refresh() -> None:
    """Delete the cached kernels if they were compiled from other sources than these."""
    cache = cache_dir()
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
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"{_STAMP}.{os.getpid()}.tmp"
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:
        pass  # nowhere writable: numba compiles in every process and caches nothing
