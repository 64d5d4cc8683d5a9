"""The stop protocol: how a rank that stops on a gradient (NaN/Inf under ``nonfinite=raise``, a
value beyond the scheme's range, an encoding error) tells its peers, so that every rank raises
an error that names the tensor, the ranks and why, and none waits for a payload that never comes.

Three carriers, one a pattern's kind of buffer: a poison payload in a gathered buffer
(:mod:`hvd_gradq.wire.poison`: gather, scatter), a flag element (:func:`stop_flag`: the
hierarchical pattern's fp32 pieces) and a statistic no real bucket can have (:func:`range_stat`:
the summable pattern's Max-allreduce). Each is read back to ``{rank: why}`` and turned into the
one error (:func:`stopped`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import GradqError, NonFiniteError, RangeError
from ..schemes.options import NonFinite
from ..spec import Config
from ..wire.payload import read_header
from ..wire.poison import Stop
from ..wire.poison import headers as _headers
from ..wire.poison import stops as _stops


def stops_on_values(config: Config) -> str | None:
    """The option under which ``config`` stops a step on a gradient's values (``nonfinite=raise``,
    ``fp16:overflow=raise``), or None. A frontend that cannot poison a pattern's later phases
    refuses such a scheme there (TensorFlow's scatter and hierarchical patterns)."""
    scheme = config.scheme
    if config.policy.nonfinite is NonFinite.RAISE:
        return "nonfinite=raise"
    return "fp16:overflow=raise" if getattr(scheme, "overflow", None) == "raise" else None

def stop_of(error: GradqError) -> Stop:
    """The :class:`Stop` a rank announces for the error that stopped its encoding."""
    if isinstance(error, NonFiniteError):
        return Stop.NONFINITE
    return Stop.RANGE if isinstance(error, RangeError) else Stop.ERROR

def stops_in(buf: NDArray[np.uint8], ranks: Sequence[int] | None = None) -> dict[int, Stop]:
    """{rank: why} of the poisons (:func:`hvd_gradq.wire.poison.poison`) in a gathered buffer
    (payload i from rank ``ranks[i]``, by default i): the payloads one after the other (1-D), or
    one a row of a fixed width (2-D, TensorFlow's; a row's bytes past its payload are padding)."""
    arr = np.asarray(buf, np.uint8)
    heads = [read_header(row) for row in arr] if arr.ndim == 2 else _headers(arr.reshape(-1))
    return _stops(heads, ranks)

_PEER = {
    Stop.NONFINITE: "had non-finite values (NaN/Inf) in this gradient (nonfinite=raise; the default "
                    "nonfinite=propagate carries them through as Horovod does)",
    Stop.RANGE: "had a finite value in this gradient that the scheme cannot quantize (beyond the range of its "
                "float32 arithmetic, Scheme.limit, or fp16's under fp16:overflow=raise); that rank's error gives "
                "the magnitude and what to change (a smaller loss scale, nonfinite=skip, overflow=saturate)",
    Stop.ERROR: "stopped with an error on this gradient (that rank's error says which)",
}

def plain_nonfinite(name: str, how: str) -> NonFiniteError:
    """The error every rank raises under ``nonfinite=raise`` when a tensor that Horovod's own
    allreduce reduced (``how``: which, and why this tensor went so) came back holding NaN/Inf.
    The sum carries any rank's NaN/Inf to every rank, bit for bit, so every rank raises it alike;
    which rank held them is not known there (a compressed tensor's stop names the rank)."""
    return NonFiniteError(
        f"{name}: the sum over ranks holds non-finite values (NaN/Inf) and nonfinite=raise: some rank's gradient "
        f"held them (or overflowed fp16's range), and this tensor went through {how}, which carries them to every "
        "rank, so every rank stops here. Find where the gradient overflows (a smaller learning rate or loss scale), "
        "or set nonfinite=propagate to carry them through as Horovod does (GradScaler then skips the step)")


def stopped(name: str, stops: dict[int, Stop]) -> GradqError:
    """The error a rank raises when peers stopped on a gradient: ``stops`` maps each such rank to
    why. A NonFiniteError if any had NaN/Inf, a RangeError if any had a value too large, else a
    GradqError; the message names the tensor, the ranks and why (:func:`stops_of` reads them back)."""
    kinds = sorted(set(stops.values()))
    text = "; ".join(f"rank(s) {sorted(r for r, s in stops.items() if s is k)} {_PEER[k]}" for k in kinds)
    cls = NonFiniteError if Stop.NONFINITE in kinds else RangeError if Stop.RANGE in kinds else GradqError
    error = cls(f"{name}: {text}")
    setattr(error, "_gradq_stops", dict(stops))  # noqa: B010 (an attribute no GradqError declares)
    return error

def stops_of(error: BaseException) -> dict[int, Stop]:
    """The ranks and reasons an error of :func:`stopped` names; empty for any other error."""
    stops: dict[int, Stop] = getattr(error, "_gradq_stops", {})
    return stops

def stop_flag(why: Stop, rank: int) -> float:
    """The flag element saying that ``rank`` stopped on a gradient, and why."""
    return float(int(why) + 4 * (rank + 1))

def flag_stop(flag: float) -> tuple[Stop, int] | None:
    """(why, rank) of a :func:`stop_flag`, or None for 0.0 (no rank stopped)."""
    code = int(flag)
    if code == 0:
        return None
    return Stop(code % 4), code // 4 - 1

def peer_message(why: Stop) -> str:
    """What a rank says about a peer that stopped for ``why`` (after "rank N ")."""
    return _PEER[why]

# -- the summable pattern's statistics: a rank that stopped on a value too large -------------------
# A level scheme's statistics are below 2**127 wherever its input is below Scheme.limit (at most
# level.RANGE_LIMIT = 2**127), so the float32 values 2**128 - (r + 1) * 2**104 (all >= 2**127 for
# r < 2**23 - 1) cannot be statistics: a rank r that meets a value beyond the limit sends its
# own in every bucket, and the Max-allreduce hands every rank the lowest such rank.
_STAT_TOP = 2.0**128

_STAT_ULP = 2.0**104

_STAT_FLOOR = 2.0**127

def range_stat(rank: int) -> float:
    """The statistic rank ``rank`` sends in every bucket when its gradient is beyond the limit."""
    return _STAT_TOP - (rank + 1) * _STAT_ULP

def names_a_rank(top: Any) -> Any:
    """Whether reduced statistics ``top`` (an array of any frontend) name a rank beyond the range
    (:func:`range_stat`), element-wise: the test :func:`range_rank` makes, for a graph."""
    return top >= _STAT_FLOOR

def range_rank(top: float) -> int | None:
    """The rank a reduced statistic names (:func:`range_stat`), or None for a real statistic
    (NaN and +inf, the non-finite signals, are not ranks either)."""
    if not _STAT_FLOOR <= top < _STAT_TOP:
        return None
    return round((_STAT_TOP - top) / _STAT_ULP) - 1
