"""Several emulated hosts on one Linux machine, with shaped links and real byte counters.

:class:`EmulatedCluster` builds ``n`` hosts out of network namespaces and runs ``ranks_per_host``
Horovod ranks (Gloo controller; default one) on each, launched the way ``horovodrun --gloo``
would, so that every byte between hosts crosses a veth link shaped by ``tc tbf`` and is counted
by the kernel::

    from bench.netemu import EmulatedCluster  # the repository root on sys.path

    with EmulatedCluster(4, rate="100mbit") as cluster:
        res = cluster.run([sys.executable, "worker.py"], timeout=300)
        res.check()                      # every rank exited 0, no timeout
        res.bytes_sent, res.bytes_recv   # per host, whole run
        res.phase_bytes("warm", "steps") # per host, between two phase marks

    with EmulatedCluster(2, rate="1gbit", ranks_per_host=2) as cluster:  # 2 hosts x 2 ranks
        res = cluster.run(argv)          # ranks 0, 1 on host 0; ranks 2, 3 on host 1
        res.returncodes, res.stdout      # per rank; res.host_of(rank), res.ranks_on(host)

Several ranks on one host reach each other at that host's own address, which the kernel
routes over the namespace's loopback: only bytes between hosts cross (and are counted on) the
host's ``eth0``, as on a real machine with several processes (Gloo sends over TCP even
between ranks of one host; MPI would use shared memory).

The links and their clean-up are in :mod:`netemu.links`, the counters, phase marks and results
in :mod:`netemu.counters`, Horovod's rendezvous server in :mod:`netemu.rendezvous`; this module
launches the ranks and re-exports the public names of all three.

Ranks and the rendezvous server get ``PR_SET_PDEATHSIG=SIGKILL``: if the launching thread
dies (even by SIGKILL) they die too; so call :meth:`EmulatedCluster.run` from the thread
that entered the cluster, or one that outlives it.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Optional, Union

from .counters import (
    PHASE_ENV,
    PHASE_TOKEN,
    HostCounters,
    PhaseMark,
    RunResult,
    _pump,
    parse_proc_net_dev,
    phase,
)
from .links import (
    BRIDGE,
    BRIDGE_ADDR,
    HOST_IFACE,
    LOCK_PATH,
    MAX_HOSTS,
    NETNS_ETC,
    SWITCH_NS,
    NetEmuError,
    NetemUnavailable,
    _cleanup_leftovers_locked,
    _ClusterLock,
    _die_with_parent,
    _kill_group,
    _Links,
    _run,
    cleanup_leftovers,
    cluster_lock,
    host_addr,
    host_ns,
    leftovers,
    netem_available,
    parse_rate,
    preflight,
)
from .rendezvous import _Rendezvous

__all__ = [
    "BRIDGE",
    "BRIDGE_ADDR",
    "HOST_IFACE",
    "LOCK_PATH",
    "PHASE_TOKEN",
    "SWITCH_NS",
    "EmulatedCluster",
    "HostCounters",
    "NetEmuError",
    "NetemUnavailable",
    "PhaseMark",
    "RunResult",
    "cleanup_leftovers",
    "cluster_lock",
    "host_addr",
    "host_ns",
    "leftovers",
    "netem_available",
    "parse_rate",
    "phase",
    "preflight",
]

# --------------------------------------------------------------------------- the cluster

_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


@dataclass
class _Rank:
    index: int  # the Horovod rank
    proc: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


class EmulatedCluster(_Links, _Rendezvous):
    """``n`` emulated hosts, each link shaped to ``rate`` both ways; see the module docstring.

    ``ranks_per_host`` (L) ranks run on each host: rank r on host r // L, with Horovod's local
    rank r % L and cross rank r // L (what ``horovodrun -H h0:L,h1:L,...`` assigns).

    ``python`` runs Horovod's rendezvous server (default: this interpreter; it must import
    ``horovod.runner``). ``burst`` and ``latency`` go to ``tc tbf``. ``offload`` keeps
    segmentation offload on the veths (cheaper, but counters under-report headers; see above).
    """

    def __init__(
        self,
        n: int,
        rate: str = "100mbit",
        delay_ms: float = 0.0,
        *,
        burst: str = "256kb",
        latency: str = "100ms",
        python: Optional[str] = None,
        offload: bool = False,
        lock_timeout: float = 600.0,
        handle_signals: bool = True,
        ranks_per_host: int = 1,
    ) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}, not {n}")
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, not {ranks_per_host}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        self.n = n
        self.ranks_per_host = ranks_per_host
        self.size = n * ranks_per_host  # Horovod ranks in all
        self.rate = rate
        self.rate_bps = parse_rate(rate)
        self.delay_ms = float(delay_ms)
        self.burst = burst
        self.latency = latency
        self.python = python or sys.executable
        self.offload = offload
        self.lock_timeout = lock_timeout
        self.handle_signals = handle_signals
        self.hosts = [host_ns(i) for i in range(n)]
        self.addresses = [host_addr(i) for i in range(n)]
        self.hostname = socket.gethostname()
        self._ip = ""
        self._tc = ""
        self._lock: Optional[_ClusterLock] = None
        self._made_ns: list[str] = []
        self._made_etc: list[Path] = []
        self._made_netns_etc = False
        self._rdv: Optional[subprocess.Popen[str]] = None
        self._rdv_lines: queue.Queue[Optional[str]] = queue.Queue()
        self.rendezvous_port = 0
        self._ranks: list[_Rank] = []
        self._old_handlers: dict[int, _Handler] = {}
        self._closing = False
        self._deferred_signal: Optional[int] = None
        self._built = False

    # ----- lifecycle

    def __enter__(self) -> EmulatedCluster:
        self._ip, self._tc = preflight()
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
        atexit.register(self.close)
        try:
            self._lock = _ClusterLock(self.lock_timeout).__enter__()
            stale = _cleanup_leftovers_locked()
            if stale:
                print(f"netemu: removed leftovers of an earlier cluster: {stale}", file=sys.stderr)
            self._build()
            self._start_rendezvous()
        except BaseException:
            self.close()
            raise
        self._built = True
        return self

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()
        if self._deferred_signal is not None and exc_type is None:
            sig, self._deferred_signal = self._deferred_signal, None
            raise KeyboardInterrupt(f"signal {sig} during cleanup")

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._closing:
            self._deferred_signal = signum  # finish cleaning up first
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def close(self) -> None:
        """Kill what this cluster started and remove everything it made; idempotent."""
        if self._closing:
            return
        self._closing = True
        errors: list[str] = []
        try:
            for rk in self._ranks:
                _kill_group(rk.proc)
            self._ranks = []
            if self._rdv is not None:
                with contextlib.suppress(OSError):
                    if self._rdv.stdin:
                        self._rdv.stdin.close()
                try:
                    self._rdv.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    _kill_group(self._rdv)
                self._rdv = None
            for ns in reversed(self._made_ns):
                cp = _run([self._ip, "netns", "delete", ns], check=False) if self._ip else None
                if cp is not None and cp.returncode != 0 and "No such file" not in cp.stderr:
                    errors.append(f"ip netns delete {ns}: {cp.stderr.strip()}")
            self._made_ns = []
            for d in self._made_etc:
                shutil.rmtree(d, ignore_errors=True)
            self._made_etc = []
            if self._made_netns_etc:
                with contextlib.suppress(OSError):
                    NETNS_ETC.rmdir()
                self._made_netns_etc = False
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            for sig, h in self._old_handlers.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, h)
            self._old_handlers = {}
            atexit.unregister(self.close)
            self._built = False
            self._closing = False
        if errors:
            raise NetEmuError("cleanup incomplete: " + "; ".join(errors))


    # ----- measuring

    def counters(self) -> list[HostCounters]:
        """Current counters of every host's ``eth0`` (and TCP retransmissions), read inside its namespace."""
        if not self._built and not self._made_ns:
            raise NetEmuError("cluster is not built (use it as a context manager)")
        return [
            parse_proc_net_dev(
                _run([self._ip, "netns", "exec", ns, "cat", "/proc/net/dev", "/proc/net/snmp"]).stdout, HOST_IFACE
            )
            for ns in self.hosts
        ]

    def run(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        timeout: float = 600.0,
        *,
        cwd: Optional[str] = None,
        echo: Optional[IO[str]] = None,
        settle_s: float = 0.05,
        cpus: Optional[Sequence[str]] = None,
    ) -> RunResult:
        """Run ``argv`` once per rank (rank r on host r // ``ranks_per_host``) and measure; never
        raises for a failed rank.

        ``env`` is added to this process's environment, then Horovod's variables on top. A rank
        that exits non-zero, ranks that disagree on a phase name, or ``timeout`` seconds kill
        every rank (process group). ``echo`` gets each output line live, prefixed ``[h<i>]``
        (one rank a host) or ``[r<rank>]`` (several). ``cpus[r]`` (a ``taskset -c`` list) pins
        rank r to those CPUs: hosts that do not share CPU time, as real hosts do not. With one
        rank a host, rank r is host r, as before.
        """
        if not self._built:
            raise NetEmuError("cluster is not built (use it as a context manager)")
        if self._ranks:
            raise NetEmuError("a run is already in progress")
        assert self._rdv is not None and self._rdv.stdin is not None
        size, per = self.size, self.ranks_per_host
        if cpus is not None and len(cpus) < size:
            raise ValueError(f"cpus has {len(cpus)} entries; one a rank is needed ({size})")
        self._rdv.stdin.write("init\n")
        self._rdv.stdin.flush()
        self._rdv_line(30.0)
        events: queue.Queue[tuple[str, int, str]] = queue.Queue()
        echo_lock = threading.Lock()
        marks = [PhaseMark("start", 0.0, tuple(self.counters()))]
        t0 = time.monotonic()
        for i in range(size):
            e = dict(os.environ)
            e.update(env or {})
            e.update(self.rank_env(i))
            e[PHASE_ENV] = "1"
            pin = ["taskset", "-c", cpus[i]] if cpus else []
            proc = subprocess.Popen(
                [self._ip, "netns", "exec", self.hosts[i // per], *pin, *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                env=e, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
            )
            rk = _Rank(i, proc)
            self._ranks.append(rk)
            label = f"h{i}" if per == 1 else f"r{i}"
            for stream, sink, tag in ((proc.stdout, rk.stdout, "out"), (proc.stderr, rk.stderr, "err")):
                th = threading.Thread(
                    target=_pump, args=(stream, sink, i, tag, events, echo, echo_lock, label), daemon=True,
                    name=f"netemu-{label}-{tag}",
                )
                th.start()
                rk.threads.append(th)
        arrived: list[list[str]] = [[] for _ in range(size)]
        stdout_done: set[int] = set()
        error: Optional[str] = None
        timed_out = False
        deadline = t0 + timeout
        try:
            while True:
                try:
                    kind, i, text = events.get(timeout=0.05)
                    if kind == "phase":
                        arrived[i].append(text)
                    elif kind == "eof" and text == "out":
                        stdout_done.add(i)
                except queue.Empty:
                    pass
                k = len(marks) - 1  # index of the next phase mark
                if all(len(a) > k for a in arrived):
                    names = {a[k] for a in arrived}
                    if len(names) > 1:
                        error = f"ranks disagree on phase mark #{k + 1}: {[a[k] for a in arrived]}"
                        break
                    time.sleep(settle_s)
                    marks.append(PhaseMark(names.pop(), time.monotonic() - t0, tuple(self.counters())))
                    for rk in self._ranks:
                        with contextlib.suppress(OSError, ValueError):
                            assert rk.proc.stdin is not None
                            rk.proc.stdin.write("go\n")
                            rk.proc.stdin.flush()
                    continue
                codes = [rk.proc.poll() for rk in self._ranks]
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    error = f"rank {bad[0][0]} exited with {bad[0][1]}; the others were killed"
                    break
                waiting = [r for r in range(size) if len(arrived[r]) > k and codes[r] is None]
                gone = [r for r in range(size) if codes[r] == 0 and r in stdout_done and len(arrived[r]) <= k]
                if waiting and gone:
                    error = (f"ranks {gone} exited without reaching phase mark {arrived[waiting[0]][k]!r} "
                             f"that ranks {waiting} wait at")
                    break
                if all(c is not None for c in codes):
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    error = f"timeout after {timeout:.0f} s"
                    break
        finally:
            for rk in self._ranks:
                if rk.proc.poll() is None:
                    _kill_group(rk.proc)
            for rk in self._ranks:
                for th in rk.threads:
                    th.join(timeout=5)
                with contextlib.suppress(OSError, ValueError):
                    assert rk.proc.stdin is not None
                    rk.proc.stdin.close()
            ranks, self._ranks = self._ranks, []
        elapsed = time.monotonic() - t0
        time.sleep(max(settle_s, 0.1))
        marks.append(PhaseMark("end", time.monotonic() - t0, tuple(self.counters())))
        return RunResult(
            argv=list(argv),
            returncodes=[rk.proc.returncode for rk in ranks],
            stdout=["".join(rk.stdout) for rk in ranks],
            stderr=["".join(rk.stderr) for rk in ranks],
            phases=marks,
            elapsed=elapsed,
            timed_out=timed_out,
            error=error,
            rate_bps=self.rate_bps,
            ranks_per_host=per,
        )


