"""Host-side (NumPy) encoding to wire bytes and decoding of gathered payloads, shared by the
frontends. Uses the fused kernels of :mod:`hvd_gradq.kernels` when they are available."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..api import Payload, dequantize, quantize, split
from ..errors import GradqError, NonFiniteError, RangeError, RankMismatchError
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from ..spec import Config
from ..wire.payload import read_header
from ..wire.poison import Stop, poison, stop_in
from ..wire.poison import headers as _headers
from ..wire.poison import stops as _stops
from ..xp import Seed

__all__ = ["Stop", "poison", "stop_in"]  # the wire's poison (wire/poison.py), as the frontends use it


def encode(scheme: Scheme | Config, x: NDArray[Any], seed: Seed,
           name: str) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """Payload bytes of flat float32 ``x`` and this rank's own decoded values (for EF and for
    summing without decoding one's own payload twice); a config's ``nonfinite`` applies."""
    p = quantize(x, scheme, seed=seed, name=name)
    own = dequantize(p).astype(np.float32, copy=False).reshape(-1)
    return p.to_array(), own


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


# -- one float that says a rank stopped: the hierarchical pattern's flag -------------------------
# 0.0: no rank stopped; else why + 4 * (rank + 1), exact in float32 for ranks below 2**21.


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


def split_checked(buf: NDArray[np.uint8], name: str, ranks: Sequence[int] | None = None) -> list[Payload]:
    """The payloads of a gathered buffer, all of one size: a poison (:func:`poison`) raises the
    error of :func:`stopped` naming the ranks that sent one (``ranks[i]`` is the rank of the
    i-th payload; by default i), other sizes a model that differs (RankMismatchError)."""
    peers = stops_in(buf, ranks)
    if peers:
        raise stopped(name, peers)
    payloads = split(buf)
    sizes = {p.n for p in payloads}
    if len(sizes) > 1:
        raise RankMismatchError(
            f"{name}: ranks sent payloads of {sorted(sizes)} elements; the model differs across ranks"
        )
    return payloads


def decode_sum(
    buf: NDArray[np.uint8], own_rank: int, own: NDArray[np.float32] | None, name: str = "tensor",
    ranks: Sequence[int] | None = None,
) -> tuple[NDArray[np.float32], int]:
    """Sum of every payload in a gathered buffer, in rank order; returns (sum, payload count).

    ``own`` (this rank's decoded payload) is used in place of decoding it again: decoding is
    deterministic, so the result is the same bits on every rank. ``ranks``: as in
    :func:`split_checked`, for the errors.
    """
    payloads = split_checked(buf, name, ranks)
    total: NDArray[np.float32] | None = None
    for r, p in enumerate(payloads):
        v = own if (r == own_rank and own is not None) else dequantize(p).astype(np.float32, copy=False).reshape(-1)
        total = v.copy() if total is None else total + v
    assert total is not None
    return total, len(payloads)


CONFIG_BLOCK = 256
#: the version of the configuration ranks compare (one for both frontends; bumped when a field's
#: meaning changes, so ranks running different hvd_gradq versions refuse each other)
CONFIG_VERSION = 5


def config_text(full_spec: str, pattern: str, seed: int, frontend: str, name: str = "") -> str:
    """What every rank of a compressor must agree on, in one format for both frontends:
    the spec (policy included), the pattern asked for, the seed, the frontend, TensorFlow's
    compressor name (its collectives' scope) and :data:`CONFIG_VERSION`."""
    fields = [full_spec, f"pattern={pattern}", f"seed={seed}"] + ([f"name={name}"] if name else [])
    return "|".join([*fields, frontend, f"v={CONFIG_VERSION}"])


def config_block(text: str) -> NDArray[np.uint8]:
    """A rank's configuration as a fixed-size block (2-byte length, then UTF-8), so that one
    allgather of equal shapes carries every rank's configuration and can run asynchronously."""
    raw = text.encode()[: CONFIG_BLOCK - 2]
    out = np.zeros(CONFIG_BLOCK, np.uint8)
    out[0], out[1] = len(raw) >> 8, len(raw) & 0xFF
    out[2 : 2 + len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def check_config_blocks(gathered: NDArray[np.uint8]) -> None:
    """Raise RankMismatchError naming the ranks if the allgathered :func:`config_block` s differ."""
    rows = np.asarray(gathered, np.uint8).reshape(-1, CONFIG_BLOCK)
    _check([bytes(r[2 : 2 + (int(r[0]) << 8 | int(r[1]))]).decode(errors="replace") for r in rows])


def _check(configs: list[str]) -> None:
    if len(set(configs)) > 1:
        groups: dict[str, list[int]] = {}
        for r, c in enumerate(configs):
            groups.setdefault(c, []).append(r)
        detail = "; ".join(f"ranks {rs}: {c!r}" for c, rs in groups.items())
        raise RankMismatchError(f"ranks disagree on the hvd_gradq configuration: {detail}")
