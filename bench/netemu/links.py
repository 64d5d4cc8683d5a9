"""The network of :mod:`netemu`: namespaces, veth links shaped by ``tc``, the machine-wide lock
and the removal of what a killed cluster left. Everything here needs root.

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

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

NS_PREFIX = "hvdq-"
SWITCH_NS = "hvdq-sw"
BRIDGE = "hvdqbr0"
BRIDGE_ADDR = "198.18.0.1"
HOST_IFACE = "eth0"
PREFIX_LEN = 24
MAX_HOSTS = 64
LOCK_PATH = "/run/lock/hvdq-netemu.lock"
NETNS_ETC = Path("/etc/netns")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_OUR_NS_RE = re.compile(r"^hvdq-(?:sw|h\d+|probe\d+)$")
_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class NetEmuError(RuntimeError):
    """The emulated network could not be built, used or removed."""


class NetemUnavailable(NetEmuError):
    """``delay_ms`` was asked for but this kernel has no ``netem`` qdisc."""



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


# --------------------------------------------------------------------------- building (a mixin of EmulatedCluster)


class _Links:
    """Builds the switch and the hosts of an :class:`netemu.EmulatedCluster`; it sets the attributes
    declared here. A mixin, so that the building code reads as methods of the cluster it builds."""

    n: int
    rate: str
    burst: str
    latency: str
    delay_ms: float
    offload: bool
    hosts: list[str]
    addresses: list[str]
    hostname: str
    _ip: str
    _tc: str
    _made_ns: list[str]
    _made_etc: list[Path]
    _made_netns_etc: bool

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


# --------------------------------------------------------------------------- processes


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
