"""hvd_gradq/reduce/names.py: the one rule for collective names and for the seeds of the draws."""
from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

from hvd_gradq.reduce import names
from hvd_gradq.reduce.names import Kind
from hvd_gradq.xp import NUMPY, step_words, step_words_int, stream_seed

PACKAGE = Path(__file__).resolve().parents[2] / "hvd_gradq"


def test_collective_names_follow_the_rule() -> None:
    assert names.collective("", Kind.GATHER, "fc.weight") == "hvd_gradq.g.fc.weight"
    assert names.collective("c3.", Kind.HIER, "7.p2", 4) == "hvd_gradq.c3.h4.7.p2"
    assert names.collective("ps1.", Kind.CONFIG) == "hvd_gradq.ps1.config"
    every = {names.collective(scope, kind, tensor, phase)
             for scope in ("", "c0.", "c1.") for kind in Kind for tensor in ("a", "b", "7")
             for phase in (None, 1, 2)}
    assert len(every) == 3 * len(Kind) * 3 * 3  # no two (scope, kind, tensor, phase) share a name


def test_no_module_spells_a_collective_name_itself() -> None:
    """Every collective name comes from names.collective: no f-string "hvd_gradq.{..." elsewhere."""
    spelled = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p.name != "names.py"
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r'name=f"hvd_gradq\.|f"hvd_gradq\.\{', line)]
    assert not spelled, spelled


def test_the_seed_rule_restated_from_its_primitives() -> None:
    for base, rank, key, step in [(0, 0, "w", 0), (11, 3, "fc.weight#2", 7), (2**40, 1, "x#host#reduce", 123456)]:
        want = step_words(NUMPY, stream_seed(base, rank, zlib.crc32(key.encode())), np.int64(step))
        assert names.words(base, rank, key, step) == (int(want[0]), int(want[1]))
        assert names.Streams(base, rank, key.split("#")[0])("#" + key.split("#", 1)[1] if "#" in key else "") == \
            stream_seed(base, rank, zlib.crc32(key.encode()))


def test_host_step_words_are_the_array_namespace_words() -> None:
    """The host's integer form of step_words (names.words runs it a tensor a step) against the
    array form every namespace runs, over seeds and steps across both 32-bit words."""
    rng = np.random.default_rng(3)
    seeds = [0, 1, 2**32 - 1, 2**32, 2**64 - 1] + [int(v) for v in rng.integers(0, 2**63, 20)]
    steps = [0, 1, 2**31, 2**32 - 1, 2**32, 2**40 + 5, 2**62] + [int(v) for v in rng.integers(0, 2**62, 20)]
    for seed in seeds:
        for step in steps:
            a, b = step_words(NUMPY, seed, np.int64(step))
            assert step_words_int(seed, step) == (int(a), int(b)), (seed, step)


def test_streams_differ_by_rank_tensor_and_step() -> None:
    seen = {names.words(5, r, key, s) for r in range(4) for key in ("a", "a#0", "a#1", "a#reduce", "b")
            for s in range(50)}
    assert len(seen) == 4 * 5 * 50
