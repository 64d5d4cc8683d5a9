"""Every path to a benchmark (``bench/...``) or a result (``results/...``) that the repository's text
names exists, and every relative Markdown link resolves: moving a script or a result file without
its references fails here, not in a reader's shell.

Scripts under ``bench/`` and ``scripts/`` may name a result they write that is not committed (a
default ``--out``): there the folder must exist. ``results/raw/`` is a run's scratch (ignored by git).
``git show <commit>:path`` names an old file on purpose and is not checked."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".setup-logs", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
             ".hypothesis", "build", "dist", ".whl", ".gl", ".docker-wheels", "raw"}
SKIP_UNDER = ("tests/compat/horovod_tests",)  # Horovod's own files, copied unmodified
TEXT = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".json", ".jsonl"}
EXTRA = {"Dockerfile", ".dockerignore", ".gitignore", "run"}

# a path starts the word: not after "/", ":" (git show c:path) or another path character
PATH = re.compile(r"(?<![\w/:.-])((?:bench|results)/[\w./-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def text_files() -> list[Path]:
    out = []
    for here, dirs, files in os.walk(ROOT):
        rel = Path(here).relative_to(ROOT).as_posix()
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and (d if rel == "." else f"{rel}/{d}") not in SKIP_UNDER]
        out += [Path(here) / f for f in files if Path(f).suffix in TEXT or f in EXTRA]
    return out


def missing(path: str, writer: bool) -> bool:
    path = path.rstrip(".-/")
    if path in ("bench", "results") or path.startswith("results/raw"):
        return False
    target = ROOT / path
    if target.exists():
        return False
    return not (writer and path.startswith("results/") and target.parent.is_dir())


def test_named_bench_and_results_paths_exist() -> None:
    bad = []
    for f in text_files():
        rel = f.relative_to(ROOT).as_posix()
        writer = rel.startswith(("bench/", "scripts/")) and f.suffix == ".py"
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in PATH.finditer(line):
                if "<" not in m.group(1) and missing(m.group(1), writer):
                    bad.append(f"{rel}:{n}: {m.group(1)}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def test_relative_markdown_links_resolve() -> None:
    bad = []
    for f in text_files():
        if f.suffix != ".md":
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in LINK.finditer(line):
                target = m.group(1).partition("#")[0]
                if not target or "://" in target or target.startswith("mailto:"):
                    continue
                if not (f.parent / target).exists():
                    bad.append(f"{f.relative_to(ROOT)}:{n}: {m.group(1)}")
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)
