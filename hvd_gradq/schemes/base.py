"""Only for ``hvd_gradq/torch/compressor.py``, which is being rewritten: delete with its import.

What was here lives in :mod:`.scheme` (``Scheme``, ``Section``, ``Combine``), :mod:`.level`
(``LevelScheme``, ``EvenLevelScheme``, the float32 limits, ``bucket_rows``), :mod:`.summable`
(``encode_shared``, ``local_stats``, ``decode_codes``) and :mod:`.options` (``NonFinite``,
``Scales``, ``param``). Nothing else imports this module (``tests/unit/test_structure.py`` checks);
it names exactly what that one file imports from it, so that it needs no edit meanwhile.
"""
from __future__ import annotations

from .level import EvenLevelScheme
from .options import NonFinite
from .scheme import Scheme
from .summable import decode_codes, encode_shared, local_stats

__all__ = ["EvenLevelScheme", "NonFinite", "Scheme", "decode_codes", "encode_shared", "local_stats"]
