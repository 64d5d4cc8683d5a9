"""Loading a scheme's compiled kernels while the job starts, so that its first step does not.

A kernel's first call in a process loads its machine code from the cache (:mod:`hvd_gradq.kernels`),
and the first of all imports numba and builds numba's CPU target (its registries import NumPy's
and SciPy's bindings): 0.4 s on an idle core of the project's machine, seconds on a busy one, all
of it inside the first ``compress()`` (issue 35). Nothing in that depends on the gradients, so a
compressor starts it when it is built (:func:`start`), on a daemon thread, while the script goes
on building its model, its optimizer and its data, and Horovod broadcasts the parameters.

The thread runs what ``python -m hvd_gradq warm`` runs to fill the cache, through the host codec
the frontends run (:func:`hvd_gradq.reduce.codec.encode`, then :func:`hvd_gradq.api.dequantize`),
on a small tensor of two buckets and a tail: numba compiles and caches a kernel per argument
type, and other types (read-only arrays, say) would compile kernels no step may ever call. The
bytes it makes are thrown away; the loaded kernels stay, process-wide.

**Safe to race.** The first step may reach a kernel the thread is still loading: numba serializes
compiling and loading under one lock, so the step waits for that kernel instead of loading it
twice, and the kernel modules import without cycles (``tests/unit/test_structure.py``), so two
threads importing them cannot deadlock. A cold cache compiles here instead (minutes of CPU; the
first step then waits for what it needs, as it did before), and the probe, which times kernels,
waits for the thread first (:func:`settle`), so that no figure is taken beside a compile. Any
error is left for the first step to meet and report in its own place: the thread logs it at
DEBUG and ends.

**Forks.** A process forked while the thread imports or loads (a data loader's workers) would
inherit the locks it holds, taken by a thread the child does not have: the child would hang at
its first numba import or kernel. So a ``fork()`` first waits for the thread (``os.register_at_fork``),
which costs nothing once the kernels are loaded, and no more than the first step would wait.

**What it costs.** The same CPU as before, earlier: a script whose first step follows the
compressor at once still waits for most of it (the thread holds the GIL while numba imports).
Not started where nothing would load: without the kernels (``HVD_GRADQ_KERNELS=0``), and for
``none`` where the cost model chooses (it saves no byte, so every tensor goes as Horovod's own
fp32 allreduce and nothing is encoded; every other scheme, ``fp16`` and ``topk`` too, at least
scans its input with a kernel).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np

from ..api import dequantize, split
from ..kernels import feedback as fused
from ..reduce import codec
from ..schemes.plain import NoneScheme
from ..schemes.scheme import Scheme

log = logging.getLogger("hvd_gradq")

_lock = threading.Lock()
_started: set[str] = set()  # scheme specs whose kernels a thread loads or loaded, in this process
_threads: list[threading.Thread] = []  # started and not yet waited for (settle)


def wanted(scheme: Scheme, priced: bool) -> bool:
    """Whether a compressor of ``scheme`` will run a kernel (``priced``: the cost model chooses its
    patterns; see the module docstring), with the kernels on (``HVD_GRADQ_KERNELS``, read without
    importing numba)."""
    if os.environ.get("HVD_GRADQ_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return not (isinstance(scheme, NoneScheme) and priced)


def start(schemes: Sequence[Scheme], priced: bool = True) -> threading.Thread | None:
    """Load the kernels of ``schemes`` (a compressor's; ``priced``: as :func:`wanted`'s) on a
    daemon thread, once a scheme and process; the thread, or None where there is nothing to load."""
    with _lock:
        todo = [s for s in schemes if wanted(s, priced) and s.spec not in _started]
        _started.update(s.spec for s in todo)
    if not todo:
        return None
    t = threading.Thread(target=load, args=(todo,), name="hvd_gradq-prefetch", daemon=True)
    with _lock:
        _threads.append(t)
    t.start()
    return t


def settle() -> None:
    """Wait for every loading thread started so far (what times kernels calls it first)."""
    with _lock:
        running = [t for t in _threads if t is not threading.current_thread()]
        _threads[:] = [t for t in _threads if t not in running]
    for t in running:
        t.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=settle)  # no lock of a loading thread carried into a child (module docstring)


def load(schemes: Sequence[Scheme]) -> None:
    """Run each scheme's encode and decode once on a small tensor (the module docstring)."""
    try:
        for s in schemes:
            x = np.random.default_rng(0).standard_normal(2 * s.bucket + 7).astype(np.float32)
            buf, _ = codec.encode(s, x, 0, "prefetch")
            for p in split(buf):
                dequantize(p)
        fused.warm()  # error feedback's passes (a few ms from the cache, whether or not a tensor needs them)
    except Exception:  # the first step meets it again and reports it there
        log.debug("hvd_gradq: loading the kernels ahead of the first step failed", exc_info=True)
