"""The handshake: what every rank of a compressor must agree on before its first reduction (the
configuration, one format for both frontends), laid out as a fixed-size block that one
allgather of equal shapes carries, and the check of the gathered blocks that names the ranks
that differ. The frontends run the allgather (:mod:`hvd_gradq.torch.handshake`,
:mod:`hvd_gradq.tensorflow.handshake`) through :meth:`hvd_gradq.frontend.compressor.CompressorCore.handshake`."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..errors import RankMismatchError

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
