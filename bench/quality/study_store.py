"""The quality study's saved runs: one gzip-compressed JSON-lines file per study.

A study is hundreds of small runs (``results/quality/study_runs/main.jsonl.gz`` holds 720). One file
keeps the repository lean (a file a run was 847 files) and still diffs as data: each line is
``{"key": ..., "run": {...}}``, sorted by key, so a rerun that adds runs rewrites the file with the
old lines unchanged. Written only by the study's main process, atomically (a temporary file,
then ``os.replace``), after every finished run, so an interrupted study resumes from what it saved.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any


def key_of(r: dict[str, Any]) -> str:
    """A run's key: its task, worker count, spec, rate and seed (the old file name, unchanged)."""
    safe = r["spec"].replace(":", "_").replace(",", "_").replace("=", "-")
    return f"{r['task']}_w{r['workers']}/{safe}__lr{r['lr']:g}__seed{r['seed']}"


class RunStore:
    """The saved runs of one study, in ``path`` (created on the first :meth:`put`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        if path.exists():
            with gzip.open(path, "rt", encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        self.runs[rec["key"]] = rec["run"]

    def get(self, r: dict[str, Any]) -> dict[str, Any] | None:
        return self.runs.get(key_of(r))

    def has(self, r: dict[str, Any]) -> bool:
        return key_of(r) in self.runs

    def put(self, r: dict[str, Any], out: dict[str, Any]) -> None:
        self.runs[key_of(r)] = out
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        # mtime=0: the same runs give the same bytes, so an unchanged study leaves git clean
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for k in sorted(self.runs):
                gz.write((json.dumps({"key": k, "run": self.runs[k]}, sort_keys=True) + "\n").encode())
        os.replace(tmp, self.path)


def import_folder(folder: Path, store: RunStore) -> int:
    """Move a study saved the old way (one JSON file a run under ``folder``) into ``store``."""
    n = 0
    for p in sorted(folder.glob("*/*.json")):
        key = f"{p.parent.name}/{p.stem}"
        store.runs[key] = json.loads(p.read_text())
        n += 1
    return n
