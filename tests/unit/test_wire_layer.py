"""One owner for the bytes (issue 14): ``hvd_gradq/wire/`` knows no scheme, and every function
of the library that lays bytes out lives in ``wire/`` or ``kernels/`` (the compiled loops)."""
from __future__ import annotations

import ast
import pathlib
import re
import zlib

import numpy as np

import hvd_gradq
from hvd_gradq import wire

ROOT = pathlib.Path(hvd_gradq.__file__).parent

# What lays bytes: struct packing, bitcasts and byte views, bytes read back into arrays, the
# the check field, and functions named pack*/unpack*.
_MARKERS = re.compile(r"struct\.|\.view\(np\.uint8\)|\.view\(np\.dtype|bitcast|frombuffer\(|65521|\b_MOD\b|CHECK_OFFSET")
_NAMES = re.compile(r"^_?(un)?pack")

# Places outside wire/ and kernels/ that still lay bytes, each with what it should call instead.
# The config handshake block is not a payload. The list may shrink; nothing may be added to it.
KNOWN = {
    ("reduce/handshake.py", "config_block"),  # the rank handshake's fixed block, not a payload
}


def _modules(under: pathlib.Path) -> list[pathlib.Path]:
    return sorted(under.rglob("*.py"))


def _imported(path: pathlib.Path) -> set[str]:
    """Absolute names of the hvd_gradq modules a file imports (relative imports resolved)."""
    pkg = ["hvd_gradq", *path.relative_to(ROOT).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_wire_imports_no_scheme_and_no_spec():
    files = _modules(ROOT / "wire")
    assert {f.name for f in files} >= {"__init__.py", "packing.py", "payload.py"}
    for f in files:
        bad = {m for m in _imported(f) if m.startswith(("hvd_gradq.schemes", "hvd_gradq.spec", "hvd_gradq.registry"))}
        assert not bad, f"{f.name} imports {sorted(bad)}: the wire must not know the schemes"


def _byte_layers() -> set[tuple[str, str]]:
    found = set()
    for f in _modules(ROOT):
        rel = f.relative_to(ROOT).as_posix()
        src = f.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = ast.get_source_segment(src, node) or ""
                if _NAMES.match(node.name) or _MARKERS.search(body):
                    found.add((rel, node.name))
    return found


def test_every_byte_laying_function_lives_in_wire_or_kernels():
    found = _byte_layers()
    assert ("wire/payload.py", "read_header") in found and ("wire/packing.py", "pack") in found  # the scan sees them
    outside = {(m, fn) for m, fn in found if not m.startswith(("wire/", "kernels/"))}
    assert outside <= KNOWN, f"bytes laid outside hvd_gradq/wire: {sorted(outside - KNOWN)}"


def _code(path: pathlib.Path) -> str:
    return re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", path.read_text())  # comments and docstrings out


def test_the_checks_of_the_bytes_live_in_wire():
    """Payloads are checked by CRC-32 (version 3; version 2's weighted sum mod 65521 is gone),
    the other carriers by wire/integrity.py: no module computes a check of bytes elsewhere."""
    assert not [f for f in _modules(ROOT) if "65521" in _code(f)]
    hits = {f.relative_to(ROOT).as_posix() for f in _modules(ROOT) if re.search(r"\bcrc32\(", _code(f))}
    # reduce/names.py: a tensor name's stable key (no bytes on the wire)
    assert hits <= {"wire/payload.py", "wire/integrity.py", "reduce/names.py"}, hits
    assert {"wire/payload.py", "wire/integrity.py"} <= hits


def test_header_spec_is_read_as_text():
    """The wire hands back the spec text of any well-formed header, even one that names no
    scheme: turning it into a scheme is the decoder's step (hvd_gradq.api)."""
    p = hvd_gradq.quantize(np.arange(6, dtype=np.float32), "orq:levels=3", seed=1)
    raw = bytearray(p.to_array())
    spec = p.scheme.spec.encode()
    i = bytes(raw).index(spec)
    raw[i : i + 3] = b"zzz"  # "zzz:bucket=..." names no registered scheme
    raw[wire.CHECK_OFFSET : wire.CHECK_OFFSET + 4] = b"\0\0\0\0"
    buf = np.frombuffer(bytes(raw), np.uint8).copy()
    check = zlib.crc32(bytes(raw))  # the payload's CRC-32, its check field zeroed
    buf[wire.CHECK_OFFSET : wire.CHECK_OFFSET + 4] = np.frombuffer(check.to_bytes(4, "little"), np.uint8)
    head = wire.read_header(buf)
    assert head.spec == "zzz" + p.scheme.spec[3:]
    assert head.shape == (6,) and head.dtype == "float32" and head.end == len(buf)


def test_topk_index_bits_are_in_the_wire():
    rng = np.random.default_rng(0)
    for bits in (1, 3, 7, 13, 31):
        v = rng.integers(0, 1 << bits, 37, dtype=np.int64)
        packed = np.asarray(wire.pack_bits(hvd_gradq.xp.NUMPY, v, bits))
        # LSB-first bitstream, written out independently
        stream = "".join(format(int(x), f"0{bits}b")[::-1] for x in v)
        stream += "0" * (-len(stream) % 8)
        want = [int(stream[k : k + 8][::-1], 2) for k in range(0, len(stream), 8)]
        assert packed.tolist() == want
        assert np.asarray(wire.unpack_bits(hvd_gradq.xp.NUMPY, packed, bits, 37)).tolist() == v.tolist()
