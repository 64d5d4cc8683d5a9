"""scripts/demo.py's command line: any spec as a job, help on every option (issue: day one)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_cli", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["demo_cli"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_jobs_take_shorthands_stock_and_any_spec() -> None:
    demo = _demo()
    jobs = demo.parse_jobs("fp32,orq:levels=4,ef=true;stock-fp16,qsgd:levels=2,bucket=256")
    assert [spec for _, spec in jobs] == ["stock-none", "orq:levels=4,ef=true", "stock-fp16",
                                          "qsgd:levels=2,bucket=256"]
    assert jobs[0][0] == "no compression" and jobs[1][0] == "orq:levels=4,ef=true"


def test_a_bad_job_names_itself_and_the_choices() -> None:
    demo = _demo()
    with pytest.raises(ValueError, match=r"'orq:levls=4'.*shorthand \(fp32 fp16 orq orq3 bingrad\)"):
        demo.parse_jobs("fp32,orq:levls=4")
    with pytest.raises(ValueError, match="empty"):
        demo.parse_jobs(" , ;")


def test_every_option_has_help_and_rows_name_real_options() -> None:
    ap = _demo().parser()
    options = {o: a.help for a in ap._actions for o in a.option_strings if o not in ("-h", "--help")}
    assert {"--rate", "--jobs", "--steps", "--lr", "--target", "--eval-every", "--seed", "--timeout",
            "--json"} <= set(options)
    assert all(h and len(h) > 10 for h in options.values()), options
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--help"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert "hvd_gradq spec" in out
    # the table's rows name options the demo has (it once named --compression, which it lacks)
    demo = _demo()
    summary = {"curve": [{"accuracy": 0.7, "train_s": 3.0, "step": 10}], "test_accuracy": 0.7, "step_time_s": 0.1,
               "compress_s_per_step": 0.01, "bytes_sent": 1000, "steps": 10, "ratio_vs_fp32": 4.0}
    text = demo.table([demo.Result("ORQ-4", "orq:levels=4", 5.0, summary)], 65.0, False)
    named = {m for m in re.findall(r"\((--[a-z-]+)", text)}
    assert named and named <= set(options), (named, text)
    assert "orq:levels=4" in text


def test_the_readmes_demo_sample_is_a_committed_transcript_verbatim() -> None:
    """The README's demo table is copied from a transcript under results/e2e/ that it names, row
    labels and numbers alike (it once showed an older run's figures under a label the file lacked)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("The demo (`bash scripts/demo.sh`) as [results/e2e/")
    named = re.search(r"\]\(([^)]+\.txt)\)", readme[start:])  # the link to the transcript
    assert named, "the README's demo sample names no transcript"
    a = readme.index("```\n", start) + 4
    block = readme[a:readme.index("```", a)]
    assert "step speed vs no compression" in block and block in (ROOT / named.group(1)).read_text()
    newest = max((ROOT / "results" / "e2e").glob("demo*.txt"), key=lambda f: _committed(f))
    assert _committed(ROOT / named.group(1)) == _committed(newest), f"{newest} is newer than the README's sample"


def _committed(path: Path) -> int:
    """When ``path`` was last committed (seconds since the epoch; 0 outside a git checkout)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", str(path)], capture_output=True, text=True,
                             cwd=ROOT, timeout=60).stdout.strip()
    except OSError:
        return 0
    return int(out or 0)
