"""Elastic Horovod with an hvd_gradq TensorFlow compressor under Keras ``fit``: ORQ-5+EF,
``pattern=scatter``, 2 -> 3 -> 2 ranks, with Horovod's Keras elastic state and callbacks.

The discovery script lists ``localhost:2`` until the first epoch ends, then adds ``127.0.0.1:1``
(a reset that grows the world: Horovod syncs the state, the joining rank traces its step and the
compressor syncs at its first reduction); in the next epoch the worker on 127.0.0.1 kills itself
inside a step, after its first gradient's reduction and with the next one's alltoall out (a failed
step: the survivors restore the last commit, the host is blacklisted, the world shrinks back to 2).
One launch, under a hard timeout of its own (``elastic_run.run``): a hang fails the test.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from elastic_run import discovery_script, elastic_cmd, run

pytestmark = pytest.mark.parallel
WORKER = Path(__file__).parent / "worker_elastic_tf.py"


def events(out: Path) -> dict[int, list[dict[str, Any]]]:
    """Each process's events, in the order it wrote them."""
    return {int(f.stem): [json.loads(line) for line in f.read_text().splitlines()] for f in out.glob("*.jsonl")}


def test_elastic_keras_2_3_2_with_a_worker_killed_mid_step(tmp_path: Path) -> None:
    log = tmp_path / "epochs.log"
    disc = discovery_script(tmp_path / "discover.sh", log, ["localhost:2", "localhost:2,127.0.0.1:1"])
    cmd = elastic_cmd(WORKER, disc, 2, 2, 3, ["--out", str(tmp_path), "--epochs-log", str(log),
                                              "--epochs", "4", "--batches", "5", "--kill-at", "1,2"])
    # ~50 s on a quiet 2-core machine, 30 of them a survivor waiting out Gloo's timeout after the kill
    done = run(cmd, timeout=240, extra_env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert done.returncode == 0, done.stdout[-12000:]
    per_pid = events(tmp_path)
    ev = [e for es in per_pid.values() for e in es]
    text = done.stdout[-6000:]

    # the schedule happened: a worker was killed mid-step at 3 ranks, the job ended on 2
    kills = [e for e in ev if e["kind"] == "kill"]
    assert len(kills) == 1 and kills[0]["host"] == "127.0.0.1", text
    assert kills[0]["decodes"] == 2, kills  # one gradient fully reduced, the next one's collectives out
    steps = [e for e in ev if e["kind"] == "step"]
    sizes = [e["size"] for e in per_pid[next(e["pid"] for e in steps if e["rank"] == 0)] if e["kind"] == "step"]
    runs = [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]
    assert runs == [2, 3, 2], f"world sizes over rank 0's steps: {runs}\n{text}"
    finals = [e for e in ev if e["kind"] == "done"]
    assert sorted(e["rank"] for e in finals) == [0, 1] and len({e["params"] for e in finals}) == 1, finals
    assert all(e["patterns"] == ["scatter"] for e in finals), finals  # the gradients really were compressed

    # every rank's parameters equal after every step, in every world
    assert steps and all(e["equal"] for e in steps), [e for e in steps if not e["equal"]][:3]

    # a new generation in each world, the same on every rank of it, agreed in that world;
    # the owner residuals each step left were made in the world of that step
    by_gen: dict[int, set[int]] = defaultdict(set)
    for e in steps:
        by_gen[e["generation"]].add(e["size"])
        assert e["gen_world"] == e["world"], e
        if e["owners"]:
            assert e["owners_world"] == e["world"], e
    gens = sorted(by_gen)
    assert len(gens) == 3 and all(len(s) == 1 for s in by_gen.values()), dict(by_gen)
    assert [next(iter(by_gen[g])) for g in gens] == [2, 3, 2]
    assert all(e["owners"] > 0 for e in steps), [e for e in steps if not e["owners"]][:3]

    # after the failed step each survivor's restore rolled its worker residuals back to its last
    # commit (the failed step had written the first gradient's: the kill came after it), and it
    # entered training again with those
    survivors = [es for es in per_pid.values() if any(e["kind"] == "done" for e in es)]
    assert len(survivors) == 2
    for es in survivors:
        syncs = [i for i, e in enumerate(es) if e["kind"] == "sync"]
        assert len(syncs) == 3, es  # the start, the grown world, the shrunk world
        last = syncs[-1]
        commit = [e for e in es[:last] if e["kind"] == "commit"][-1]
        failed = [e for e in es[:last] if e["kind"] == "step"][-1]  # the last step that finished
        assert (failed["size"], es[last]["size"]) == (3, 2), (failed, es[last])
        restores = [e for e in es[:last] if e["kind"] == "restore"]
        assert len(restores) == 1, restores
        assert restores[0]["before"] != commit["residuals"], (commit, restores)  # the failed step had written
        assert restores[0]["after"] == es[last]["residuals"] == commit["residuals"], (commit, restores, es[last])
        assert es[last]["steps"] > 0, es[last]  # resumed with its step counters, not from zero

    # the rule's log line: the old world's owner residuals were dropped at each world change (2 -> 3, 3 -> 2)
    changes = {(int(m[1]), int(m[2])) for m in re.finditer(
        r"elastic reset, rank \d of (\d) \(.*?\) -> rank \d of (\d) \(.*?\): dropped \d+ owner residual\(s\)", done.stdout)}
    assert {(2, 3), (3, 2)} <= changes, f"{changes}\n{text}"

    # training still converges
    losses = [e["loss"] for e in sorted((e for e in ev if e["kind"] == "epoch"), key=lambda e: e["epoch"])]
    assert len(losses) >= 4 and losses[-1] < 0.8 * losses[0], losses
