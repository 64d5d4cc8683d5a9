"""What :mod:`netemu` measures: per-host kernel counters, phase marks and the result of a run.

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
"""
from __future__ import annotations

import itertools
import os
import queue
import re
import sys
import threading
from dataclasses import dataclass
from typing import IO, Optional

from .links import NetEmuError

PHASE_TOKEN = "NETBENCH_PHASE"
PHASE_ENV = "NETBENCH_PHASES"

_PHASE_RE = re.compile(rf"(?:^|\s){PHASE_TOKEN} (\S+)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


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
    for a, b in itertools.pairwise(lines):
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
    """What :meth:`EmulatedCluster.run` measured. Counters and byte lists are per host (the
    kernel counts a host's link, not a process); return codes and outputs are per rank. With
    ``ranks_per_host`` L, rank r ran on host r // L (:meth:`host_of`, :meth:`ranks_on`)."""

    argv: list[str]
    returncodes: list[int]
    stdout: list[str]
    stderr: list[str]
    phases: list[PhaseMark]
    elapsed: float
    timed_out: bool = False
    error: Optional[str] = None
    rate_bps: float = 0.0
    ranks_per_host: int = 1

    @property
    def hosts(self) -> int:
        """Number of hosts."""
        return len(self.phases[0].counters) if self.phases else len(self.returncodes) // self.ranks_per_host

    def host_of(self, rank: int) -> int:
        """The host that ``rank`` ran on."""
        return rank // self.ranks_per_host

    def ranks_on(self, host: int) -> list[int]:
        """The ranks that ran on ``host``."""
        return list(range(host * self.ranks_per_host, (host + 1) * self.ranks_per_host))

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
            lines.append(f"--- rank {r} on host {self.host_of(r)} (last {tail} chars) ---\n{out[-tail:]}")
        return "\n".join(lines)

    def check(self) -> RunResult:
        """Raise :class:`NetEmuError` with every rank's output unless the run succeeded."""
        if not self.ok:
            raise NetEmuError("emulated run failed:\n" + self.summary())
        return self



def _pump(
    stream: Optional[IO[str]],
    sink: list[str],
    rank: int,
    tag: str,
    events: queue.Queue[tuple[str, int, str]],
    echo: Optional[IO[str]],
    echo_lock: threading.Lock,
    label: str = "",
) -> None:
    label = label or f"h{rank}"
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
                echo.write(f"[{label}] {line}" if line.endswith("\n") else f"[{label}] {line}\n")
                echo.flush()
    events.put(("eof", rank, tag))

