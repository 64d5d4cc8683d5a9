"""``horovodrun --gloo`` with made-up host names that all run on this machine: several ranks a
"host" for the hierarchical pattern's tests (``-H h0:2,h1:2``), without ssh or a second machine.

Horovod's launcher runs a rank locally when its host name resolves to one of this machine's
addresses, and over ssh otherwise; here every name resolves to 127.0.0.1. Everything else
(rendezvous, Horovod's LOCAL/CROSS rank and size variables, per host name) is Horovod's own.
Only for tests: real multi-host jobs name real hosts.
"""
from __future__ import annotations

import sys

from horovod.runner import gloo_run, launch
from horovod.runner.util import network


def _resolve(host_name: str) -> str:
    return "127.0.0.1"


network.resolve_host_address = _resolve
gloo_run.network.resolve_host_address = _resolve
launch.network.filter_local_addresses = lambda names: []

if __name__ == "__main__":
    sys.argv[0] = "horovodrun"
    launch.run_commandline()
