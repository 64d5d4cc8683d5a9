"""Horovod's rendezvous server for :class:`netemu.EmulatedCluster`: it runs in the switch namespace,
and every rank gets the variables ``horovodrun --gloo`` would set to reach it."""
from __future__ import annotations

import queue
import subprocess
import threading
import time
from typing import Optional

from .links import BRIDGE_ADDR, HOST_IFACE, SWITCH_NS, NetEmuError, _die_with_parent

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



class _Rendezvous:
    """Starts and drives the rendezvous server; a mixin of :class:`netemu.EmulatedCluster`, which sets
    the attributes declared here."""

    n: int
    ranks_per_host: int
    hosts: list[str]
    python: str
    _ip: str
    _rdv: Optional[subprocess.Popen[str]]
    _rdv_lines: queue.Queue[Optional[str]]
    rendezvous_port: int

    def _start_rendezvous(self) -> None:
        hosts = ",".join(f"{h}:{self.ranks_per_host}" for h in self.hosts)
        self._rdv = subprocess.Popen(
            [self._ip, "netns", "exec", SWITCH_NS, self.python, "-c", _RENDEZVOUS_CODE, hosts,
             str(self.n * self.ranks_per_host)],
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

    # ----- running

    def rank_env(self, rank: int) -> dict[str, str]:
        """The variables ``horovodrun --gloo -H h0:L,h1:L,...`` would set for ``rank``: ranks fill
        hosts in order, so rank r runs on host r // L as local rank r % L (L = ``ranks_per_host``),
        and its cross rank (its index among the ranks of that local rank) is its host's index."""
        per = self.ranks_per_host
        if not 0 <= rank < self.n * per:
            raise ValueError(f"rank must be in 0..{self.n * per - 1}, not {rank}")
        host, local = divmod(rank, per)
        return {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": BRIDGE_ADDR,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.rendezvous_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": HOST_IFACE,
            "NCCL_SOCKET_IFNAME": HOST_IFACE,
            "HOROVOD_HOSTNAME": self.hosts[host],
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(self.n * per),
            "HOROVOD_LOCAL_RANK": str(local),
            "HOROVOD_LOCAL_SIZE": str(per),
            "HOROVOD_CROSS_RANK": str(host),
            "HOROVOD_CROSS_SIZE": str(self.n),
            "PYTHONUNBUFFERED": "1",
        }

