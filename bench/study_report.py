"""Tables and plots of the quality study (filled in below)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def write(runs: list[dict[str, Any]], paths: list[Path]) -> None:
    pass
