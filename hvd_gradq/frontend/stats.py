"""Byte accounting: what this rank sent and received, per pattern, against fp32 allreduce."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Counts:
    sent: int = 0
    received: int = 0
    fp32: int = 0
    tensors: int = 0

    def add(self, sent: int, received: int, fp32: int) -> None:
        self.sent += sent
        self.received += received
        self.fp32 += fp32
        self.tensors += 1

    def as_dict(self) -> dict[str, Any]:
        ratio = self.fp32 / self.sent if self.sent else 0.0
        return {"sent": self.sent, "received": self.received, "fp32": self.fp32, "tensors": self.tensors,
                "ratio_vs_fp32": ratio}


@dataclass
class Stats:
    """Per tensor, the most recent step's bytes; in total, everything since construction."""

    last: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)
    total: dict[str, _Counts] = field(default_factory=lambda: defaultdict(_Counts))

    def record(self, key: str, pattern: str, sent: int, received: int, fp32: int) -> None:
        self.last[key] = (pattern, sent, received, fp32)
        self.total[pattern].add(sent, received, fp32)

    def summary(self) -> dict[str, Any]:
        last: dict[str, _Counts] = defaultdict(_Counts)
        for pattern, s, r, f in self.last.values():
            last[pattern].add(s, r, f)
        all_last = _Counts()
        all_total = _Counts()
        for c in last.values():
            all_last.sent += c.sent
            all_last.received += c.received
            all_last.fp32 += c.fp32
            all_last.tensors += c.tensors
        for c in self.total.values():
            all_total.sent += c.sent
            all_total.received += c.received
            all_total.fp32 += c.fp32
            all_total.tensors += c.tensors
        return {
            "last_step": {"all": all_last.as_dict(), **{p: c.as_dict() for p, c in last.items()}},
            "total": {"all": all_total.as_dict(), **{p: c.as_dict() for p, c in self.total.items()}},
        }
