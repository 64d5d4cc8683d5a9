"""Horovod 0.28.1's own elastic PyTorch tests pass with hvd_gradq compressors (Gloo, localhost and
127.0.0.1 as two hosts).

``horovod_tests/elastic/`` holds Horovod's ``test_elastic_*.py``, ``elastic_common.py`` and their
``data/elastic_*_main.py`` unmodified. Each case runs the torch suite in a pytest of its own, with
``elastic_hook/`` on ``PYTHONPATH``: its ``sitecustomize`` wraps ``hvd.DistributedOptimizer`` in
every worker so that the main's optimizer gets ``hvd_gradq.torch.from_spec(spec, pattern=...)``
(the mains' model has six parameters, which ``pattern=auto`` would send uncompressed; the case
names the pattern). ``stock`` runs the suite unchanged, first, as the baseline. The tests that run
are those that do not skip themselves in 0.28.1 for known Horovod bugs (issues 2030 and 2908).
Besides Horovod's own assertions (the epochs, ranks, sizes and rendezvous of each world), each
worker records at exit (``elastic_hook``) that it compressed with hvd_gradq and the hash of its
parameters; the ranks that ended in the same generation of one launch must agree bit for bit.

TensorFlow's elastic suites are not run: ``hvd_gradq.tensorflow`` refuses elastic jobs
(:func:`hvd_gradq.frontend.elastic.refuse_graph_frontend`). The summary lines printed here
(``compat elastic torch <case>: passed/run``) are the table the README quotes.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from elastic_run import run

pytestmark = pytest.mark.parallel
HERE = Path(__file__).parent
SUITE = HERE / "horovod_tests" / "elastic"
ALL = "hosts_added_and_removed or all_ranks_failure or reset_limit"
# The scheme families run the test whose worlds change size both ways with a worker that fails
# (the others stop the whole job, which involves no compressor state): the suite's time stays
# inside the CI budget. Stock runs all three, as the baseline.
RESIZE = "hosts_added_and_removed"
# (case, spec, pattern, tests): stock, then one scheme of each family
CASES = [
    ("stock", "stock", "", ALL),
    ("orq5-ef-scatter", "orq:levels=5,ef=true", "scatter", RESIZE),
    ("bingrad-ef-gather", "bingrad:ef=true", "gather", RESIZE),
    ("qsgd4-summable", "qsgd:levels=4", "summable", RESIZE),
    ("topk-ef-gather", "topk:ratio=0.5,ef=true", "gather", RESIZE),
]


def run_suite(tmp: Path, spec: str, pattern: str, tests: str) -> tuple[dict[str, str], list[dict[str, object]], str]:
    """Horovod's torch elastic suite with ``spec``: (test -> outcome, worker records, output)."""
    out = tmp / "records"
    out.mkdir()
    junit = tmp / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_elastic_torch.py", "-k", tests,
           f"--junitxml={junit}"]
    env = {"PYTHONPATH": f"{HERE / 'elastic_hook'}:{Path(__file__).parents[2]}", "COMPAT_ELASTIC_SPEC": spec,
           "COMPAT_ELASTIC_PATTERN": pattern, "COMPAT_ELASTIC_OUT": str(out)}
    done = run(cmd, timeout=600, cwd=SUITE, extra_env=env)
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            bad = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name", "?")] = bad[0] if bad else "passed"
    records = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    return outcomes, records, done.stdout


@pytest.mark.parametrize("case,spec,pattern,tests", CASES, ids=[c[0] for c in CASES])
def test_horovod_elastic_torch_suite(tmp_path: Path, case: str, spec: str, pattern: str, tests: str) -> None:
    outcomes, records, output = run_suite(tmp_path, spec, pattern, tests)
    passed = sum(v == "passed" for v in outcomes.values())
    print(f"compat elastic torch {case} ({spec}{', pattern=' + pattern if pattern else ''}): "
          f"{passed}/{len(outcomes)} passed")
    want = len(tests.split(" or "))
    assert len(outcomes) == want and passed == want, f"{outcomes}\n{output[-12000:]}"
    if spec == "stock":
        return
    # the substitution happened: workers built hvd_gradq compressors and compressed gradients with them
    used = [r for r in records if r["compressors"] and r["steps"]]
    assert used, f"no worker compressed with hvd_gradq: {records}"
    assert max(int(r["generation"]) for r in used) >= 2, "no worker saw a reset"  # type: ignore[call-overload]
    # the ranks that ended in one generation of one launch hold the same parameters, bit for bit
    groups: dict[tuple[object, object], set[object]] = defaultdict(set)
    for r in used:
        groups[(r["logfile"], r["generation"])].add(r["params"])
    assert all(len(h) == 1 for h in groups.values()), dict(groups)
