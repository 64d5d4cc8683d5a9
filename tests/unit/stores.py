"""A residual store for feedback.Memory in the unit tests: a dict of NumPy arrays."""
from __future__ import annotations

import numpy as np


class DictStore:
    def __init__(self) -> None:
        self.d: dict[str, np.ndarray] = {}

    def read(self, key: str, like: np.ndarray) -> np.ndarray | None:
        return self.d.get(key)

    def write(self, key: str, value: np.ndarray) -> None:
        self.d[key] = value

    def forget(self, key: str) -> None:
        self.d.pop(key, None)
