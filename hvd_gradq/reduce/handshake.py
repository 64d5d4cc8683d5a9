"""The handshake: what every rank of a compressor must agree on before its first reduction (the
configuration, one format for both frontends), and the collectives that compare it. The frontends
run the allgathers (:mod:`hvd_gradq.torch.handshake`, :mod:`hvd_gradq.tensorflow.handshake`)
through :meth:`hvd_gradq.frontend.compressor.CompressorCore.handshake`.

**One first collective, whatever the options.** Every rank, whatever its ``check_ranks``, sends
one fixed-size block (:func:`config_block`) in the same allgather: a rank that skipped it would
leave the others waiting in a collective it never starts. The block holds a SHA-256 digest of the
whole configuration text (nothing is cut off: a long ``seed`` once hid the link rate, ``fallback``
and the version beyond the old block's 254 bytes), the text's length, ``check_ranks``, and as much
of the text as fits, to read. Where digests differ, a second allgather of variable size carries
every rank's whole text (:func:`text_block`), and the error names the fields that differ
(:func:`settle`); the check stops the job if any rank asked for it, so that every rank, having
read the same blocks, does the same.

**Versions.** What never changes, so that any two versions from this one on meet and name each
other instead of waiting: the collective's name (:data:`hvd_gradq.reduce.names.Kind.CONFIG`), its
dtype (uint8), the block's size (:data:`CONFIG_BLOCK`), and where the marker and the version sit
(:data:`MAGIC` at :data:`_AT`, then :data:`HANDSHAKE_VERSION`). The block starts as the blocks of
hvd_gradq before versioned handshakes did (two length bytes, then text), so those ranks show it
(``'handshake v1: ...'``) in their own mismatch error, and their blocks are named here (version 0).

**Bounded time.** Horovod's collectives wait forever for a rank that never joins. Each of the
handshake's allgathers is waited for at most :func:`timeout` seconds (``HVD_GRADQ_HANDSHAKE_TIMEOUT``);
a frontend's allgather raises :class:`Stalled` past it (:func:`wait` polls), and the core turns that
into an error that says what it waited for and why that happens (:func:`stalled`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..errors import GradqError, PayloadError, RankMismatchError
from ..wire import blocks

CONFIG_BLOCK = 256

#: the version of the configuration ranks compare (one for both frontends; bumped when a field's
#: meaning changes). It is part of ``config()``, which checkpoints are also checked against.
CONFIG_VERSION = 5

#: the version of the handshake: the block's layout and what the compared text adds to
#: ``config()`` (:func:`hvd_gradq.plan.hosts.layout`). Ranks of other versions refuse each other.
#: (0: the unversioned block of hvd_gradq up to configuration version 5.)
HANDSHAKE_VERSION = 1

#: the marker of a versioned block, and where it sits; the version follows it (2 bytes)
MAGIC = b"GQhs"
_AT = 204
_READABLE = _AT - 2  # the text a block shows, after its two length bytes
_DIGEST = 32

TIMEOUT_ENV = "HVD_GRADQ_HANDSHAKE_TIMEOUT"
#: Seconds a rank waits in a handshake collective for the other ranks. Ranks reach their first
#: step within seconds of each other (Horovod's broadcast of the parameters lines them up), so a
#: minute means one of them will not come; Horovod warns of a stalled collective at 60 s, too.
DEFAULT_TIMEOUT = 60.0


class Stalled(Exception):
    """A frontend's handshake allgather (collective ``name``) that the other ranks did not join
    within the bound; :meth:`~hvd_gradq.frontend.compressor.CompressorCore.handshake` says why."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name, seconds)
        self.name, self.seconds = name, seconds


@dataclass(frozen=True)
class Row:
    """One rank's :func:`config_block`, read back (:func:`read_blocks`)."""

    version: int  #: :data:`HANDSHAKE_VERSION` of the rank that sent it (0: before versions)
    check: bool  #: its ``check_ranks``
    digest: bytes  #: SHA-256 of its whole configuration text
    length: int  #: bytes of that text
    shown: str  #: what the block shows of it (the whole text when it fits)


def config_text(full_spec: str, pattern: str, seed: int, frontend: str, name: str = "") -> str:
    """What every rank of a compressor must agree on, in one format for both frontends:
    the spec (policy included), the pattern asked for, the seed, the frontend, TensorFlow's
    compressor name (its collectives' scope) and :data:`CONFIG_VERSION`."""
    fields = [full_spec, f"pattern={pattern}", f"seed={seed}"] + ([f"name={name}"] if name else [])
    return "|".join([*fields, frontend, f"v={CONFIG_VERSION}"])


def digest(text: str) -> bytes:
    """The SHA-256 of a configuration text: what the ranks compare, whatever its length."""
    return hashlib.sha256(text.encode()).digest()


def _shown(text: str) -> bytes:
    """The readable part of a block: the version, then as much of ``text`` as fits, cut at a
    character boundary (so it decodes)."""
    raw = f"handshake v{HANDSHAKE_VERSION}: {text}".encode()[:_READABLE]
    return raw.decode(errors="ignore").encode()


def config_block(text: str, check: bool) -> NDArray[np.uint8]:
    """A rank's configuration as one fixed-size block (the module docstring says why), laid out:
    ``[0:2]`` the readable part's length, ``[2:...]`` the readable part (:func:`_shown`),
    ``[204:208]`` :data:`MAGIC`, ``[208:210]`` :data:`HANDSHAKE_VERSION`, ``[210]`` ``check_ranks``,
    ``[212:216]`` the whole text's length, ``[216:248]`` its :func:`digest` (big-endian, zeros between)."""
    readable = _shown(text)
    head = len(readable).to_bytes(2, "big") + readable
    tail = (MAGIC + HANDSHAKE_VERSION.to_bytes(2, "big") + bytes([int(check), 0])
            + len(text.encode()).to_bytes(4, "big") + digest(text))
    raw = head.ljust(_AT, b"\0") + tail
    return np.frombuffer(raw.ljust(CONFIG_BLOCK, b"\0"), np.uint8).copy()


def _read(row: bytes) -> Row | None:
    """One block read back; None if it is no hvd_gradq handshake block of any version."""
    if row[_AT : _AT + 4] == MAGIC:
        version = int.from_bytes(row[_AT + 4 : _AT + 6], "big")
        if version != HANDSHAKE_VERSION:  # a layout this version may not know beyond the version
            return Row(version, False, b"", 0, "")
        n = int.from_bytes(row[0:2], "big")
        length = int.from_bytes(row[_AT + 8 : _AT + 12], "big")
        return Row(version, bool(row[_AT + 6]), row[_AT + 12 : _AT + 12 + _DIGEST], length,
                   row[2 : 2 + n].decode(errors="replace"))
    n = int.from_bytes(row[0:2], "big")
    if n > CONFIG_BLOCK - 2:
        return None
    text = row[2 : 2 + n].decode(errors="replace")  # hvd_gradq before versions: two length bytes, text
    return Row(0, True, b"", n, text)


def read_blocks(gathered: NDArray[np.uint8], size: int) -> list[Row]:
    """Every rank's :func:`config_block` from the allgather, in rank order; RankMismatchError
    naming the ranks if any rank runs another handshake version (nothing more can be compared)."""
    raw = bytes(np.asarray(gathered, np.uint8).reshape(-1))
    if len(raw) != size * CONFIG_BLOCK:
        raise RankMismatchError(
            f"the ranks run different hvd_gradq versions: the handshake's allgather returned {len(raw)} bytes "
            f"from {size} ranks, not {size} blocks of {CONFIG_BLOCK} (a version whose handshake block has another "
            "size). Install the same hvd_gradq version on every rank")
    rows = [_read(raw[i * CONFIG_BLOCK : (i + 1) * CONFIG_BLOCK]) for i in range(size)]
    versions: dict[str, list[int]] = {}
    for r, row in enumerate(rows):
        versions.setdefault(_version_name(row), []).append(r)
    if len(versions) > 1 or None in rows:
        detail = "; ".join(f"ranks {rs}: {v}" for v, rs in versions.items())
        raise RankMismatchError(
            f"the ranks run different hvd_gradq versions (this one's handshake is v{HANDSHAKE_VERSION}): {detail}. "
            "Install the same hvd_gradq version on every rank")
    return [row for row in rows if row is not None]


def _version_name(row: Row | None) -> str:
    if row is None:
        return "a block that is no hvd_gradq handshake (another program in this collective?)"
    if row.version == 0:
        return f"handshake v0 (hvd_gradq up to configuration version 5: {row.shown!r})"
    return f"handshake v{row.version}"


def differ(rows: list[Row]) -> bool:
    """Whether the ranks' configurations differ (the same answer on every rank: the same rows)."""
    return len({(r.digest, r.length) for r in rows}) > 1


def text_block(text: str) -> NDArray[np.uint8]:
    """A rank's whole configuration text for the second allgather (ranks' sizes differ: each
    block says its own, :mod:`hvd_gradq.wire.blocks`), run only where the digests differ."""
    return blocks.block(text.encode())


def read_texts(gathered: NDArray[np.uint8], size: int) -> list[str]:
    """Every rank's :func:`text_block`, in rank order."""
    try:
        return [b.decode(errors="replace") for b in blocks.split_blocks(np.asarray(gathered, np.uint8), size)]
    except PayloadError as e:
        raise RankMismatchError(f"the ranks' configuration texts could not be read back ({e})") from None


def settle(rows: list[Row], texts: list[str]) -> str:
    """What differs between the ranks' whole configuration ``texts``, named (the fields one group
    of ranks has and another has not, then every text in full); raised as RankMismatchError if
    any rank asked for the check (``check_ranks``), else returned for a warning."""
    groups: dict[str, list[int]] = {}
    for r, t in enumerate(texts):
        groups.setdefault(t, []).append(r)
    fields = {t: t.split("|") for t in groups}
    common = set.intersection(*(set(f) for f in fields.values()))
    differs = "; ".join(f"ranks {rs}: {', '.join(f for f in fields[t] if f not in common) or '(nothing more)'}"
                        for t, rs in groups.items())
    full = "; ".join(f"ranks {rs}: {t!r}" for t, rs in groups.items())
    msg = (f"ranks disagree on the hvd_gradq configuration: {differs} (in full: {full}). Build the compressor "
           "with the same arguments and HVD_GRADQ_* environment on every rank")
    if any(r.check for r in rows):
        raise RankMismatchError(msg)
    return msg


def timeout() -> float:
    """Seconds a handshake collective waits for the other ranks: ``HVD_GRADQ_HANDSHAKE_TIMEOUT``,
    else :data:`DEFAULT_TIMEOUT`; a GradqError for anything but a positive number."""
    return seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, "the seconds a rank waits for the others' handshake at the first step")


def seconds(env: str, default: float, what: str) -> float:
    """A bound in seconds from variable ``env`` (``what`` it bounds, for the error), else ``default``;
    a GradqError for anything but a positive number (:func:`timeout`, the verdict's wait)."""
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise GradqError(f"{env}={raw!r} is not valid: give {what}, a positive number (default {default:g})")
    return value


def wait(done: Callable[[], bool], name: str, seconds: float, timed: bool = False) -> None:
    """Poll ``done`` until it says the collective ``name`` finished; :class:`Stalled` after
    ``seconds``. The pause between polls doubles from 1 ms to 50 ms, so a long wait costs little
    CPU; ``timed``: a collective whose duration is being measured, polled every 0.1 ms instead
    (a doubling pause would round a 5 ms collective up to 7 ms)."""
    deadline = time.monotonic() + seconds
    pause = 0.0001 if timed else 0.001
    while not done():
        if time.monotonic() > deadline:
            raise Stalled(name, seconds)
        time.sleep(pause)
        pause = pause if timed else min(2 * pause, 0.05)


def stalled(e: Stalled, frontend: str, config: str, size: int) -> GradqError:
    """The error of a rank whose handshake collective the others did not join within the bound:
    what it waited for, the likely causes and what to do."""
    return GradqError(
        f"{frontend}: no handshake from the other ranks within {e.seconds:g} s. This rank waits in "
        f"collective {e.name} (the first-step check of its compressor {config!r} over {size} ranks), and some "
        "rank has not joined it. Likely causes: a rank never reached its first reduction (it failed or exited, "
        "waits in another collective, or runs other code first); a rank reduces over another process set (the "
        "collective's name says which set); a rank runs another hvd_gradq version. Build the same compressor on "
        f"every rank with the same hvd_gradq; if ranks reach their first step more than {e.seconds:g} s apart, set "
        f"{TIMEOUT_ENV} to a longer wait. Horovod cannot withdraw the collective started here: end the job (this "
        "error, left uncaught, does) and restart it")
