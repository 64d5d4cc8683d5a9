"""Several emulated hosts on one Linux machine, with shaped links and real byte counters.

:class:`EmulatedCluster` builds ``n`` hosts out of network namespaces and runs one Horovod
rank (Gloo controller) on each, launched the way ``horovodrun --gloo`` would, so that every
byte between ranks crosses a veth link shaped by ``tc tbf`` and is counted by the kernel::

    from hvd_gradq.bench.netemu import EmulatedCluster

    with EmulatedCluster(4, rate="100mbit") as cluster:
        res = cluster.run([sys.executable, "worker.py"], timeout=300)
        res.check()                      # every rank exited 0, no timeout
        res.bytes_sent, res.bytes_recv   # per host, whole run
        res.phase_bytes("warm", "steps") # per host, between two phase marks

Topology (everything lives in namespaces this module creates; the root namespace gets no
interface, address, route or qdisc)::

    hvdq-sw   : bridge hvdqbr0 198.18.0.1/24, ports hvdqp0..hvdqp<n-1>, Horovod's rendezvous server
    hvdq-h<i> : eth0 198.18.0.<10+i>/24 (veth peer of hvdqp<i>), lo up

Each link is shaped both ways with ``tc qdisc ... root tbf rate R burst B latency L``: on
``eth0`` inside the host (what the host sends) and on ``hvdqp<i>`` in the switch (what it
receives). ``delay_ms`` adds a ``netem delay`` under the tbf on the host side only, so the
one-way host-to-host latency is ``delay_ms`` and the round trip ``2*delay_ms``; kernels
without the ``sch_netem`` module refuse it with :class:`NetemUnavailable`.

By default generic segmentation offload is switched off on both ends of every link
(``gso_max_segs 1``), so each packet is at most one MTU as on a real NIC and the counters
include one Ethernet + IPv4 + TCP header per 1448-byte segment: 1514/1448 = 1.0456 x the
payload on bulk transfers. ``offload=True`` keeps the veth default (GSO on): about 3x less CPU
per byte (measured: 520 vs 183 Mbit/s of raw TCP through a 1gbit link on a loaded 2-core
machine), but ``/proc/net/dev`` then counts up-to-64 KiB super-packets with their headers
once, about 4.4 % under the wire, and the receiver sends fewer ACKs. The shaping is
wire-accurate either way: tbf charges every segment's headers. Use ``offload=True`` for fast
links on small machines, the default when the byte counts matter.

Bytes are read from ``/proc/net/dev`` inside each host namespace (``ip netns exec <ns> cat
/proc/net/dev``): ``eth0`` transmit bytes are what the host sent, receive bytes what it got,
Ethernet headers included, retransmissions included.

Phases. A run always records counters before launch and after the last rank exits. A worker
can also mark phase boundaries with :func:`phase`: each rank prints ``NETBENCH_PHASE <name>``
and blocks on its stdin; when every rank has reached the same mark, the launcher waits
``settle_s`` (in-flight segments and delayed ACKs land), reads every host's counters, and
releases all ranks. The bytes between two marks are therefore exact per host, up to Horovod's
own background negotiation (a few hundred bytes per cycle while ranks are alive; measure it
with an idle phase). Outside the launcher :func:`phase` does nothing.

Ranks and the rendezvous server get ``PR_SET_PDEATHSIG=SIGKILL``: if the launching thread
dies (even by SIGKILL) they die too; so call :meth:`EmulatedCluster.run` from the thread
that entered the cluster, or one that outlives it.

Concurrency and cleanup. One cluster at a time per machine: a ``flock`` on
:data:`LOCK_PATH` serialises users (a second one waits up to ``lock_timeout``). Holding the
lock, a cluster first removes leftovers of a killed earlier one. On ``__exit__``, on SIGINT/
SIGTERM (handlers installed in the main thread) and at interpreter exit it kills the ranks and
the rendezvous server it started (by process group id), deletes its namespaces (which removes
the bridge, the veths and the qdiscs) and ``/etc/netns/hvdq-*``.

Horovod 0.28.1 builds the Gloo contexts of process sets without ``HOROVOD_GLOO_IFACE``; they
bind to the address of the machine's hostname (127.0.0.1 here) and ranks in different
namespaces then fail with ``Connect timeout``. ``ip netns exec`` bind-mounts
``/etc/netns/<ns>/hosts`` over ``/etc/hosts``, so each host gets one mapping
``socket.gethostname()`` to its own address.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Callable, Optional, Union

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

NS_PREFIX = "hvdq-"
SWITCH_NS = "hvdq-sw"
BRIDGE = "hvdqbr0"
BRIDGE_ADDR = "198.18.0.1"
HOST_IFACE = "eth0"
PREFIX_LEN = 24
MAX_HOSTS = 64
LOCK_PATH = "/run/lock/hvdq-netemu.lock"
NETNS_ETC = Path("/etc/netns")
PHASE_TOKEN = "NETBENCH_PHASE"
PHASE_ENV = "NETBENCH_PHASES"

_PHASE_RE = re.compile(rf"(?:^|\s){PHASE_TOKEN} (\S+)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_OUR_NS_RE = re.compile(r"^hvdq-(?:sw|h\d+|probe\d+)$")
_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")

_RENDEZVOUS_CODE = """
import sys
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
hosts, n = sys.argv[1], int(sys.argv[2])
server = RendezvousServer(verbose=0)
print(server.start(), flush=True)
for line in sys.stdin:
    if line.strip() == "init":
        server.init(get_host_assignments(parse_hosts(hosts), n))
        print("ready", flush=True)
server.stop()
"""


class NetEmuError(RuntimeError):
    """The emulated network could not be built, used or removed."""


class NetemUnavailable(NetEmuError):
    """``delay_ms`` was asked for but this kernel has no ``netem`` qdisc."""


# --------------------------------------------------------------------------- worker side


def phase(name: str) -> None:
    """Mark a phase boundary from a worker; a no-op unless launched by :meth:`EmulatedCluster.run`.

    Every rank must call it with the same names in the same order. It returns once all ranks
    have reached the mark and the launcher has read every host's counters.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"phase name must match {_NAME_RE.pattern}, not {name!r}")
    if os.environ.get(PHASE_ENV) != "1":
        return
    sys.stdout.flush()
    sys.stdout.write(f"{PHASE_TOKEN} {name}\n")
    sys.stdout.flush()
    ack = sys.stdin.readline()
    if ack.strip() != "go":
        raise RuntimeError(f"netemu: launcher did not release phase {name!r} (got {ack!r})")


# --------------------------------------------------------------------------- helpers


def host_ns(i: int) -> str:
    """Namespace name of emulated host ``i``."""
    return f"{NS_PREFIX}h{i}"


def host_addr(i: int) -> str:
    """IPv4 address of emulated host ``i`` (198.18.0.0/15 is reserved for benchmarks)."""
    return f"198.18.0.{10 + i}"


def _port(i: int) -> str:
    return f"hvdqp{i}"


_RATE_UNITS = {
    "": 1.0,
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "kibit": 1024.0,
    "mibit": 1024.0**2,
    "gibit": 1024.0**3,
    "tibit": 1024.0**4,
    "bps": 8.0,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
    "kibps": 8 * 1024.0,
    "mibps": 8 * 1024.0**2,
    "gibps": 8 * 1024.0**3,
    "tibps": 8 * 1024.0**4,
}


def parse_rate(rate: str) -> float:
    """A ``tc`` rate (``100mbit``, ``1gbit``, ``12.5mbps`` = bytes/s) in bits per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", rate)
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"not a tc rate: {rate!r} (e.g. 100mbit, 1gbit, 500kbit)")
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if bits <= 0:
        raise ValueError(f"rate must be positive: {rate!r}")
    return bits


def _which(name: str) -> Optional[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which(name, path=path)


def preflight() -> tuple[str, str]:
    """Check for root, ``ip`` and ``tc``; return their paths or raise :class:`NetEmuError`."""
    if os.geteuid() != 0:
        raise NetEmuError(
            "netemu needs root (network namespaces, veth, tc): run as root, e.g. `sudo "
            f"{sys.executable} ...`; euid is {os.geteuid()}"
        )
    ip, tc = _which("ip"), _which("tc")
    missing = [n for n, p in (("ip", ip), ("tc", tc)) if p is None]
    if missing or ip is None or tc is None:
        raise NetEmuError(f"netemu needs {' and '.join(missing)} from iproute2 (apt-get install iproute2)")
    return ip, tc


def _run(args: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    try:
        cp = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise NetEmuError(f"`{' '.join(args)}` did not finish in {timeout:.0f} s") from e
    if check and cp.returncode != 0:
        raise NetEmuError(f"`{' '.join(args)}` failed ({cp.returncode}): {cp.stderr.strip() or cp.stdout.strip()}")
    return cp


def _namespaces(ip: str) -> list[str]:
    out = _run([ip, "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def leftovers() -> list[str]:
    """Everything of ours that exists now: ``hvdq-`` namespaces, ``/etc/netns/hvdq-*``, a root ``hvdqbr0``."""
    ip, _ = preflight()
    found = [f"namespace {ns}" for ns in _namespaces(ip) if ns.startswith(NS_PREFIX)]
    if NETNS_ETC.is_dir():
        found += [f"dir {p}" for p in sorted(NETNS_ETC.glob(f"{NS_PREFIX}*"))]
    if _run([ip, "link", "show", "dev", BRIDGE], check=False).returncode == 0:
        found.append(f"link {BRIDGE} in the root namespace")
    return found


def cleanup_leftovers() -> list[str]:
    """Remove what a killed cluster left (our names only); return what was removed.

    Takes the cluster lock first (waiting up to 60 s), so a running cluster is never touched.
    Processes still inside a stale namespace are not killed; they are reported.
    """
    with _ClusterLock(timeout=60.0):
        return _cleanup_leftovers_locked()


def _cleanup_leftovers_locked() -> list[str]:
    ip, _ = preflight()
    removed: list[str] = []
    for ns in _namespaces(ip):
        if not _OUR_NS_RE.match(ns):
            continue
        pids = _run([ip, "netns", "pids", ns], check=False).stdout.split()  # reported, never killed
        _run([ip, "netns", "delete", ns], check=False)
        removed.append(f"namespace {ns}" + (f" (processes still inside: {' '.join(pids)})" if pids else ""))
    if NETNS_ETC.is_dir():
        for d in sorted(NETNS_ETC.glob(f"{NS_PREFIX}*")):
            if _OUR_NS_RE.match(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"dir {d}")
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only if empty
    return removed


def netem_available() -> bool:
    """Whether this kernel has the ``netem`` qdisc (probed in a throwaway namespace)."""
    ip, tc = preflight()
    ns = f"{NS_PREFIX}probe{os.getpid()}"
    _run([ip, "netns", "add", ns])
    try:
        _run([ip, "-n", ns, "link", "set", "lo", "up"])
        return _run([ip, "netns", "exec", ns, tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                    check=False).returncode == 0
    finally:
        _run([ip, "netns", "delete", ns], check=False)


class _ClusterLock:
    """The machine-wide ``flock`` that one cluster at a time holds (see :func:`cluster_lock`)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._fd: Optional[int] = None

    def __enter__(self) -> _ClusterLock:
        Path(LOCK_PATH).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise NetEmuError(
                        f"another emulated cluster (pid {holder or '?'}) holds {LOCK_PATH} "
                        f"for more than {self.timeout:.0f} s"
                    ) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def cluster_lock(timeout: float = 600.0) -> _ClusterLock:
    """Hold the cluster lock (e.g. to check :func:`leftovers` while no cluster can be built)."""
    return _ClusterLock(timeout)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class HostCounters:
    """Kernel counters of one host's interface (``/proc/net/dev``), Ethernet headers included."""

    bytes_sent: int
    bytes_recv: int
    packets_sent: int
    packets_recv: int
    drops_sent: int = 0
    drops_recv: int = 0
    #: TCP segments this host retransmitted (``RetransSegs`` in ``/proc/net/snmp``, whole namespace).
    tcp_retrans: int = 0

    def __sub__(self, other: HostCounters) -> HostCounters:
        return HostCounters(
            self.bytes_sent - other.bytes_sent,
            self.bytes_recv - other.bytes_recv,
            self.packets_sent - other.packets_sent,
            self.packets_recv - other.packets_recv,
            self.drops_sent - other.drops_sent,
            self.drops_recv - other.drops_recv,
            self.tcp_retrans - other.tcp_retrans,
        )


def parse_proc_net_dev(text: str, iface: str) -> HostCounters:
    """The counters of ``iface`` in the text of ``/proc/net/dev`` (optionally followed by ``/proc/net/snmp``)."""
    retrans = 0
    lines = text.splitlines()
    for a, b in zip(lines, lines[1:]):
        if a.startswith("Tcp:") and b.startswith("Tcp:") and "RetransSegs" in a:
            retrans = int(b.split()[a.split().index("RetransSegs")])
    for line in lines:
        name, sep, rest = line.partition(":")
        if sep and name.strip() == iface:
            v = [int(x) for x in rest.split()]
            # rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets errs drop ...
            return HostCounters(v[8], v[0], v[9], v[1], v[11], v[3], retrans)
    raise NetEmuError(f"no interface {iface!r} in /proc/net/dev:\n{text}")


@dataclass(frozen=True)
class PhaseMark:
    """Counters of every host when all ranks reached a phase mark; ``t`` is seconds since launch."""

    name: str
    t: float
    counters: tuple[HostCounters, ...]


@dataclass
class RunResult:
    """What :meth:`EmulatedCluster.run` measured. Byte lists are per host (index = rank)."""

    argv: list[str]
    returncodes: list[int]
    stdout: list[str]
    stderr: list[str]
    phases: list[PhaseMark]
    elapsed: float
    timed_out: bool = False
    error: Optional[str] = None
    rate_bps: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.error is None and all(c == 0 for c in self.returncodes)

    @property
    def outputs(self) -> list[str]:
        """Each rank's stdout followed by its stderr."""
        return [o + e for o, e in zip(self.stdout, self.stderr)]

    def mark(self, name: str) -> PhaseMark:
        """The mark ``name``; ``start`` and ``end`` are always there."""
        for m in self.phases:
            if m.name == name:
                return m
        raise KeyError(f"no phase mark {name!r}; marks: {[m.name for m in self.phases]}")

    def delta(self, start: str = "start", end: str = "end") -> list[HostCounters]:
        """Per-host counters between two marks."""
        a, b = self.mark(start), self.mark(end)
        return [y - x for x, y in zip(a.counters, b.counters)]

    def phase_bytes(self, start: str = "start", end: str = "end") -> tuple[list[int], list[int]]:
        """(bytes sent, bytes received) per host between two marks."""
        d = self.delta(start, end)
        return [c.bytes_sent for c in d], [c.bytes_recv for c in d]

    def seconds(self, start: str = "start", end: str = "end") -> float:
        return self.mark(end).t - self.mark(start).t

    @property
    def bytes_sent(self) -> list[int]:
        """Whole run, per host."""
        return self.phase_bytes()[0]

    @property
    def bytes_recv(self) -> list[int]:
        """Whole run, per host."""
        return self.phase_bytes()[1]

    def summary(self, tail: int = 3000) -> str:
        lines = [f"argv: {' '.join(self.argv)}", f"returncodes: {self.returncodes}, elapsed {self.elapsed:.1f} s"]
        if self.timed_out:
            lines.append("TIMED OUT: all ranks were killed")
        if self.error:
            lines.append(f"error: {self.error}")
        for r, out in enumerate(self.outputs):
            lines.append(f"--- rank {r} (last {tail} chars) ---\n{out[-tail:]}")
        return "\n".join(lines)

    def check(self) -> RunResult:
        """Raise :class:`NetEmuError` with every rank's output unless the run succeeded."""
        if not self.ok:
            raise NetEmuError("emulated run failed:\n" + self.summary())
        return self


# --------------------------------------------------------------------------- the cluster

_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


@dataclass
class _Rank:
    index: int
    proc: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


class EmulatedCluster:
    """``n`` emulated hosts, each link shaped to ``rate`` both ways; see the module docstring.

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
    ) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}, not {n}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        self.n = n
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

    # ----- building

    def _ns_add(self, ns: str) -> None:
        _run([self._ip, "netns", "add", ns])
        self._made_ns.append(ns)
        _run([self._ip, "-n", ns, "link", "set", "lo", "up"])
        # No IPv6 on our links: no router solicitations or DAD packets in the counters.
        _run([self._ip, "netns", "exec", ns, "sh", "-c",
              "for f in /proc/sys/net/ipv6/conf/default/disable_ipv6 /proc/sys/net/ipv6/conf/all/disable_ipv6; "
              "do [ -w $f ] && echo 1 > $f; done; true"])

    def _shape(self, ns: str, dev: str, delay_ms: float) -> None:
        tbf = ["tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]
        if delay_ms <= 0:
            _run([self._ip, "netns", "exec", ns, self._tc, "qdisc", "add", "dev", dev, "root", *tbf])
            return
        _run([self._ip, "netns", "exec", ns, self._tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf])
        cp = _run([self._ip, "netns", "exec", ns, self._tc, "qdisc", "add", "dev", dev, "parent", "1:1",
                   "handle", "10:", "netem", "delay", f"{delay_ms}ms", "limit", "100000"], check=False)
        if cp.returncode != 0:
            msg = cp.stderr.strip()
            if "unknown" in msg.lower() or "no such file" in msg.lower():
                raise NetemUnavailable(
                    f"delay_ms={delay_ms} needs the netem qdisc (kernel module sch_netem), which this kernel "
                    f"does not have (tc: {msg!r}). Run with delay_ms=0: links are then shaped by tbf only."
                )
            raise NetEmuError(f"tc netem on {ns}/{dev} failed: {msg}")

    def _build(self) -> None:
        ip, sw = self._ip, SWITCH_NS
        self._ns_add(sw)
        _run([ip, "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
        _run([ip, "-n", sw, "addr", "add", f"{BRIDGE_ADDR}/{PREFIX_LEN}", "dev", BRIDGE])
        _run([ip, "-n", sw, "link", "set", BRIDGE, "up"])
        if not NETNS_ETC.exists():
            NETNS_ETC.mkdir(mode=0o755)
            self._made_netns_etc = True
        gso = [] if self.offload else ["gso_max_segs", "1"]
        for i, ns in enumerate(self.hosts):
            self._ns_add(ns)
            port = _port(i)
            _run([ip, "-n", sw, "link", "add", port, *gso, "type", "veth", "peer", "name", HOST_IFACE, *gso,
                  "netns", ns])
            _run([ip, "-n", sw, "link", "set", port, "master", BRIDGE])
            _run([ip, "-n", sw, "link", "set", port, "up"])
            _run([ip, "-n", ns, "addr", "add", f"{self.addresses[i]}/{PREFIX_LEN}", "dev", HOST_IFACE])
            _run([ip, "-n", ns, "link", "set", HOST_IFACE, "up"])
            self._shape(ns, HOST_IFACE, self.delay_ms)  # what host i sends
            self._shape(sw, port, 0.0)  # what host i receives
            d = NETNS_ETC / ns
            d.mkdir(mode=0o755, exist_ok=True)
            self._made_etc.append(d)
            peers = "".join(f"{a}\t{h}\n" for a, h in zip(self.addresses, self.hosts))
            (d / "hosts").write_text(
                f"127.0.0.1\tlocalhost\n{self.addresses[i]}\t{self.hostname}\n{BRIDGE_ADDR}\t{sw}\n{peers}"
            )
        self._wait_links_up()

    def _wait_links_up(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        checks = [(SWITCH_NS, BRIDGE)] + [(SWITCH_NS, _port(i)) for i in range(self.n)]
        checks += [(ns, HOST_IFACE) for ns in self.hosts]
        for ns, dev in checks:
            while True:
                out = _run([self._ip, "-n", ns, "-o", "link", "show", "dev", dev]).stdout
                if "LOWER_UP" in out and ",UP" in out:
                    break
                if time.monotonic() > deadline:
                    raise NetEmuError(f"{ns}/{dev} did not come up in {timeout:.0f} s: {out.strip()}")
                time.sleep(0.05)

    def _start_rendezvous(self) -> None:
        hosts = ",".join(f"{h}:1" for h in self.hosts)
        self._rdv = subprocess.Popen(
            [self._ip, "netns", "exec", SWITCH_NS, self.python, "-c", _RENDEZVOUS_CODE, hosts, str(self.n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        rdv = self._rdv

        def pump() -> None:
            assert rdv.stdout is not None
            for line in rdv.stdout:
                self._rdv_lines.put(line.strip())
            self._rdv_lines.put(None)

        threading.Thread(target=pump, daemon=True, name="netemu-rendezvous").start()
        first = self._rdv_line(30.0)
        if not first.isdigit():
            raise NetEmuError(f"Horovod rendezvous server did not start: {first}")
        self.rendezvous_port = int(first)

    def _rdv_line(self, timeout: float) -> str:
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._rdv_lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                raise NetEmuError("rendezvous server exited:\n" + "\n".join(got))
            if line.isdigit() or line == "ready":
                return line
            got.append(line)
        raise NetEmuError(f"rendezvous server silent for {timeout:.0f} s:\n" + "\n".join(got))

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

    # ----- running

    def rank_env(self, rank: int) -> dict[str, str]:
        """The variables ``horovodrun --gloo`` would set for ``rank`` (one slot per host)."""
        return {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": BRIDGE_ADDR,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.rendezvous_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": HOST_IFACE,
            "NCCL_SOCKET_IFNAME": HOST_IFACE,
            "HOROVOD_HOSTNAME": self.hosts[rank],
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(self.n),
            "HOROVOD_LOCAL_RANK": "0",
            "HOROVOD_LOCAL_SIZE": "1",
            "HOROVOD_CROSS_RANK": str(rank),
            "HOROVOD_CROSS_SIZE": str(self.n),
            "PYTHONUNBUFFERED": "1",
        }

    def run(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        timeout: float = 600.0,
        *,
        cwd: Optional[str] = None,
        echo: Optional[IO[str]] = None,
        settle_s: float = 0.05,
    ) -> RunResult:
        """Run ``argv`` once per host (rank i on host i) and measure; never raises for a failed rank.

        ``env`` is added to this process's environment, then Horovod's variables on top. A rank
        that exits non-zero, ranks that disagree on a phase name, or ``timeout`` seconds kill
        every rank (process group). ``echo`` gets each output line live, prefixed ``[h<i>]``.
        """
        if not self._built:
            raise NetEmuError("cluster is not built (use it as a context manager)")
        if self._ranks:
            raise NetEmuError("a run is already in progress")
        assert self._rdv is not None and self._rdv.stdin is not None
        self._rdv.stdin.write("init\n")
        self._rdv.stdin.flush()
        self._rdv_line(30.0)
        events: queue.Queue[tuple[str, int, str]] = queue.Queue()
        echo_lock = threading.Lock()
        marks = [PhaseMark("start", 0.0, tuple(self.counters()))]
        t0 = time.monotonic()
        for i in range(self.n):
            e = dict(os.environ)
            e.update(env or {})
            e.update(self.rank_env(i))
            e[PHASE_ENV] = "1"
            proc = subprocess.Popen(
                [self._ip, "netns", "exec", self.hosts[i], *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                env=e, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
            )
            rk = _Rank(i, proc)
            self._ranks.append(rk)
            for stream, sink, tag in ((proc.stdout, rk.stdout, "out"), (proc.stderr, rk.stderr, "err")):
                th = threading.Thread(
                    target=_pump, args=(stream, sink, i, tag, events, echo, echo_lock), daemon=True,
                    name=f"netemu-h{i}-{tag}",
                )
                th.start()
                rk.threads.append(th)
        arrived: list[list[str]] = [[] for _ in range(self.n)]
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
                waiting = [r for r in range(self.n) if len(arrived[r]) > k and codes[r] is None]
                gone = [r for r in range(self.n) if codes[r] == 0 and r in stdout_done and len(arrived[r]) <= k]
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
        )


def _pump(
    stream: Optional[IO[str]],
    sink: list[str],
    rank: int,
    tag: str,
    events: queue.Queue[tuple[str, int, str]],
    echo: Optional[IO[str]],
    echo_lock: threading.Lock,
) -> None:
    if stream is None:
        return
    for line in stream:
        sink.append(line)
        if tag == "out":
            m = _PHASE_RE.search(line)
            if m:
                events.put(("phase", rank, m.group(1)))
        if echo is not None:
            with echo_lock:
                echo.write(f"[h{rank}] {line}" if line.endswith("\n") else f"[h{rank}] {line}\n")
                echo.flush()
    events.put(("eof", rank, tag))


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the launching thread dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - not Linux/glibc: cleanup then relies on close()
        pass


def _kill_group(proc: subprocess.Popen[str], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, the process group of ``proc`` (it was started in its own session)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
