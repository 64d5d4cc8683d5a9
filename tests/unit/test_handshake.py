"""hvd_gradq/reduce/handshake.py: the block every rank sends first, read back; the whole
configuration compared by digest; other versions named; the bounded wait."""
from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest

from hvd_gradq.errors import GradqError, RankMismatchError
from hvd_gradq.reduce import handshake
from hvd_gradq.reduce.handshake import CONFIG_BLOCK, HANDSHAKE_VERSION, config_block, read_blocks

SHORT = "orq:levels=5|pattern=auto|seed=0|torch|v=5|hosts=2x1|link=10.0|fallback=off"
LONG_SEED = 10**300  # a seed of 301 digits: the text runs past the old block's 254 bytes


def _long(fallback: str) -> str:
    return f"orq:levels=5|pattern=auto|seed={LONG_SEED}|torch|v=5|hosts=2x1|link=10.0|fallback={fallback}"


def _old_block(text: str) -> np.ndarray:
    """A block as hvd_gradq up to configuration version 5 laid it: two length bytes, the text."""
    raw = text.encode()[:254]
    return np.frombuffer((len(raw).to_bytes(2, "big") + raw).ljust(CONFIG_BLOCK, b"\0"), np.uint8).copy()


def test_a_block_round_trips() -> None:
    for text, check in ((SHORT, True), (SHORT, False), (_long("on"), True), ("é" * 300, True)):
        block = config_block(text, check)
        assert block.dtype == np.uint8 and block.shape == (CONFIG_BLOCK,)
        (row,) = read_blocks(block, 1)
        assert row.version == HANDSHAKE_VERSION and row.check is check
        assert row.digest == hashlib.sha256(text.encode()).digest() and row.length == len(text.encode())
        shown = row.shown.removeprefix(f"handshake v{HANDSHAKE_VERSION}: ")
        assert text.startswith(shown) and "\ufffd" not in shown  # cut at a character boundary
        assert (shown == text) is (text == SHORT)  # the others run past the block


def test_the_old_block_reads_a_new_one_as_its_version() -> None:
    """A rank of hvd_gradq up to configuration version 5 reads two length bytes, then text: it
    shows the new block as 'handshake v1: ...' in its own mismatch error, not as bytes."""
    block = bytes(config_block(SHORT, True))
    n = block[0] << 8 | block[1]
    assert n <= 254 and block[2 : 2 + n].decode() == f"handshake v{HANDSHAKE_VERSION}: {SHORT}"


def test_a_long_seed_hides_no_field() -> None:
    """Issue 35, item 9: with a 301-digit seed the old block cut off the link rate, fallback and
    the version; the digests still differ where only fallback does."""
    off, on = _long("off"), _long("on")
    assert len(off.encode()) > 254 and off.encode()[:254] == on.encode()[:254]  # what the old check compared
    rows = read_blocks(np.concatenate([config_block(off, True), config_block(on, True)]), 2)
    assert handshake.differ(rows)
    texts = handshake.read_texts(np.concatenate([handshake.text_block(off), handshake.text_block(on)]), 2)
    assert texts == [off, on]
    with pytest.raises(RankMismatchError) as e:
        handshake.settle(rows, texts)
    msg = str(e.value)
    assert msg.startswith("ranks disagree on the hvd_gradq configuration: ranks [0]: fallback=off; "
                          "ranks [1]: fallback=on (in full: "), msg
    assert str(LONG_SEED) in msg and "Build the compressor with the same arguments" in msg


def test_equal_blocks_do_not_differ_whatever_check_ranks_says() -> None:
    rows = read_blocks(np.concatenate([config_block(SHORT, True), config_block(SHORT, False)]), 2)
    assert not handshake.differ(rows) and [r.check for r in rows] == [True, False]


def test_the_check_stops_if_any_rank_asks_for_it() -> None:
    other = SHORT.replace("levels=5", "levels=3")
    texts = [SHORT, other, SHORT]
    for checks, raises in (((False, True, False), True), ((True, False, False), True), ((False,) * 3, False)):
        rows = read_blocks(np.concatenate([config_block(t, c) for t, c in zip(texts, checks)]), 3)
        if raises:
            with pytest.raises(RankMismatchError, match=r"ranks \[0, 2\]: orq:levels=5; ranks \[1\]: orq:levels=3"):
                handshake.settle(rows, texts)
        else:  # nobody asked: the difference is returned, for a warning
            assert "ranks [1]: orq:levels=3" in handshake.settle(rows, texts)


def test_fields_only_one_side_has_are_named() -> None:
    gather = "orq:levels=5|pattern=gather|seed=0|torch|v=5|hosts=2x1"
    rows = read_blocks(np.concatenate([config_block(SHORT, True), config_block(gather, True)]), 2)
    with pytest.raises(RankMismatchError,
                       match=r"ranks \[0\]: pattern=auto, link=10\.0, fallback=off; ranks \[1\]: pattern=gather "):
        handshake.settle(rows, [SHORT, gather])


def test_another_version_is_named_not_compared() -> None:
    mine = config_block(SHORT, True)
    old = _old_block("orq:levels=5|pattern=auto|seed=0|torch|v=5|hosts=2x1|link=10.0")
    with pytest.raises(RankMismatchError) as e:
        read_blocks(np.concatenate([mine, old]), 2)
    msg = str(e.value)
    assert "the ranks run different hvd_gradq versions (this one's handshake is v1): ranks [0]: handshake v1; " \
           "ranks [1]: handshake v0 (hvd_gradq up to configuration version 5: 'orq:levels=5|" in msg, msg
    assert msg.endswith("Install the same hvd_gradq version on every rank")
    newer = mine.copy()
    newer[209] += 1  # the version's low byte
    with pytest.raises(RankMismatchError, match=r"ranks \[0, 2\]: handshake v1; ranks \[1\]: handshake v2\. "):
        read_blocks(np.concatenate([mine, newer, mine]), 3)
    junk = np.full(CONFIG_BLOCK, 255, np.uint8)
    with pytest.raises(RankMismatchError, match="no hvd_gradq handshake"):
        read_blocks(np.concatenate([mine, junk]), 2)
    with pytest.raises(RankMismatchError, match=r"returned 768 bytes from 2 ranks, not 2 blocks of 256"):
        read_blocks(np.concatenate([mine, mine, mine]), 2)  # a version whose block is larger


def test_the_wait_is_bounded() -> None:
    t0 = time.monotonic()
    with pytest.raises(handshake.Stalled) as e:
        handshake.wait(lambda: False, "hvd_gradq.config", 0.2)
    assert 0.2 <= time.monotonic() - t0 < 2 and (e.value.name, e.value.seconds) == ("hvd_gradq.config", 0.2)
    calls = iter([False, False, True])
    handshake.wait(lambda: next(calls), "x", 5)  # done on the third poll


def test_the_stall_error_says_what_to_do() -> None:
    err = handshake.stalled(handshake.Stalled("hvd_gradq.ps1.config", 3.0), "hvd_gradq.torch", SHORT, 4)
    msg = str(err)
    assert isinstance(err, GradqError)
    assert msg.startswith("hvd_gradq.torch: no handshake from the other ranks within 3 s. This rank waits in "
                          "collective hvd_gradq.ps1.config"), msg
    for words in (SHORT, "over 4 ranks", "never reached its first reduction", "another hvd_gradq version",
                  "HVD_GRADQ_HANDSHAKE_TIMEOUT", "end the job"):
        assert words in msg, words


def test_the_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(handshake.TIMEOUT_ENV, raising=False)
    assert handshake.timeout() == handshake.DEFAULT_TIMEOUT == 60.0
    monkeypatch.setenv(handshake.TIMEOUT_ENV, "2.5")
    assert handshake.timeout() == 2.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(handshake.TIMEOUT_ENV, bad)
        with pytest.raises(GradqError, match=f"HVD_GRADQ_HANDSHAKE_TIMEOUT='{bad}' is not valid"):
            handshake.timeout()


def test_tensorflow_waits_for_its_eager_allgather_on_a_thread() -> None:
    """Horovod's eager TensorFlow ops give no handle to poll: the frontend runs the allgather on a
    thread and waits for it at most the bound; its result and its errors come back."""
    pytest.importorskip("tensorflow")
    from hvd_gradq.tensorflow.handshake import bounded

    assert bounded(lambda: 7, "x", 5.0) == 7
    with pytest.raises(KeyError):
        bounded(lambda: {}["k"], "x", 5.0)
    t0 = time.monotonic()
    with pytest.raises(handshake.Stalled) as e:
        bounded(lambda: time.sleep(3), "hvd_gradq.tfconfig", 0.2)
    assert e.value.name == "hvd_gradq.tfconfig" and time.monotonic() - t0 < 2
