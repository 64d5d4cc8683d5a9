"""Elastic Horovod with an hvd_gradq compressor: ORQ-5+EF, ``pattern=scatter``, 2 -> 3 -> 2 ranks.

The discovery script lists ``localhost:2`` until the first epoch ends, then adds ``127.0.0.1:1``
(a reset that grows the world: Horovod syncs the state); in the next epoch the worker on
127.0.0.1 kills itself inside backward, with some of its collectives already out (a failed step:
the survivors restore the last commit, the host is blacklisted, and the world shrinks back to 2).
One launch, under a hard timeout of its own (``elastic_run.run``): a hang fails the test.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from elastic_run import discovery_script, elastic_cmd, run

pytestmark = pytest.mark.parallel
WORKER = Path(__file__).parent / "worker_elastic_torch.py"


def events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_elastic_2_3_2_with_a_worker_killed_mid_step(tmp_path: Path) -> None:
    log = tmp_path / "epochs.log"
    disc = discovery_script(tmp_path / "discover.sh", log, ["localhost:2", "localhost:2,127.0.0.1:1"])
    cmd = elastic_cmd(WORKER, disc, 2, 2, 3, ["--out", str(tmp_path), "--epochs-log", str(log),
                                              "--epochs", "4", "--batches", "5", "--kill-at", "1,2"])
    done = run(cmd, timeout=420)  # ~90 s on a quiet machine with warm kernels
    assert done.returncode == 0, done.stdout[-12000:]
    ev = events(tmp_path)
    text = done.stdout[-6000:]

    # the schedule happened: a worker was killed mid-step at 3 ranks, the job ended on 2
    kills = [e for e in ev if e["kind"] == "kill"]
    assert len(kills) == 1 and kills[0]["host"] == "127.0.0.1", text
    sizes = [e["size"] for e in ev if e["kind"] == "step" and e["rank"] == 0]
    runs = [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]
    assert runs == [2, 3, 2], f"world sizes over the steps: {runs}\n{text}"
    finals = [e for e in ev if e["kind"] == "done"]
    assert sorted(e["rank"] for e in finals) == [0, 1] and len({e["params"] for e in finals}) == 1, finals

    # every rank's parameters equal after every step, in every world
    steps = [e for e in ev if e["kind"] == "step"]
    assert steps and all(e["equal"] for e in steps), [e for e in steps if not e["equal"]][:3]

    # a new generation at each reset, the same on every rank of a world; owner residuals made in this world
    by_gen: dict[int, set[int]] = defaultdict(set)
    for e in steps:
        by_gen[e["generation"]].add(e["size"])
        if e["owners"]:
            assert e["owners_world"] == e["world"], e
    gens = sorted(by_gen)
    assert len(gens) == 3 and all(len(s) == 1 for s in by_gen.values()), dict(by_gen)
    assert [next(iter(by_gen[g])) for g in gens] == [2, 3, 2]

    # after the failed step each survivor restored its residuals to its last commit (the failed step's
    # half-written residuals are gone), and the owner residuals of the 3-rank world were dropped
    last_sync = {}
    for e in ev:
        if e["kind"] == "sync":
            last_sync[e["pid"]] = e
    survivors = [e for e in last_sync.values() if e["generation"] == gens[-1]]
    assert len(survivors) == 2 and all(e["residuals"] == e["committed"] for e in survivors), survivors
    assert all(e["steps"] > 0 for e in survivors)  # resumed with step counters, not from zero

    # the rule's log line (rank 0, which survives every reset): the old world's owner residuals went
    assert "owner residual(s)" in done.stdout and "dropped" in done.stdout, text

    # training still converges
    losses = [e["loss"] for e in sorted((e for e in ev if e["kind"] == "epoch"), key=lambda e: e["epoch"])]
    assert len(losses) >= 4 and losses[-1] < 0.8 * losses[0], losses
