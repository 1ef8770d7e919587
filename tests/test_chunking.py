"""Shell-output chunking: both twins, against Python's own UTF-8 decoder.

What is guaranteed (and asserted here):

* every chunk is a non-empty ``str`` of at most ``max_chunk`` UTF-8 bytes;
* the chunks of a stream join up to ``stream.decode("utf-8", "replace")`` for *any* bytes, any
  read sizes and any ``drain`` timing: chunks are only cut between closed decoder steps (a whole
  character or a whole maximal invalid subpart), never inside an invalid sequence, so cuts can
  never change the number of U+FFFD;
* without ``drain`` calls, the chunk boundaries do not depend on the read sizes, and they follow
  the cutting rule restated independently in :func:`reference`;
* the two twins return the same chunks, hold the same bytes and raise the same errors.
"""

from __future__ import annotations

import array
import functools
import itertools
import random
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast import chunking as facade

from .conftest import IMPLEMENTATIONS, assert_same_api, twin

FFFD = "\ufffd"
EMOJI = "\U0001f600".encode()  # 4 bytes: F0 9F 98 80
PROPERTY = settings(max_examples=200, deadline=None)

# Fragments that exercise every branch of the UTF-8 automaton: each length of valid character,
# truncated characters, overlongs, surrogates, values above U+10FFFF, stray bytes, line ends.
FRAGMENTS = [
    b"a",
    b"line\n",
    b"\r\n",
    b"\r",
    b"\n",
    "\u00e9".encode(),
    "\u20ac".encode(),
    EMOJI,
    EMOJI[:1],
    EMOJI[:2],
    EMOJI[:3],
    "\u20ac".encode()[:2],
    b"\xc2",
    b"\xc0\xaf",
    b"\xe0\x80",
    b"\xe0\xa0",
    b"\xed\x9f",
    b"\xed\xa0\x80",
    b"\xed\xbf",
    b"\xf0\x90",
    b"\xf4\x8f",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b"\xbf",
    b"\xff",
    b"\xf5",
]
messy = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=5)), max_size=60).map(b"".join)
text = st.text(
    st.one_of(st.sampled_from("\n\r \u00e9\u20ac\U0001f600x"), st.characters(codec="utf-8")), max_size=200
)
# Few distinct characters, many line ends: newline and \r\n cuts land near the limit often.
lines = st.text(st.sampled_from("ab\r\n\u00e9"), min_size=10, max_size=120)
sizes = st.integers(4, 40)
cuts = st.lists(st.integers(0, 10_000), max_size=25)
# The compiled twin walks a read in place, keeps a bytes read by reference, copies other buffers.
kinds = st.lists(st.sampled_from([bytes, bytearray, memoryview]), min_size=1, max_size=4)


def split_points(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    out, prev = [], 0
    for p in marks + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def wire(chunk: str) -> int:
    return len(chunk.encode("utf-8"))


def session(  # type: ignore[no-untyped-def]
    chunker, reads: list[bytes], drains: list[bool] | None = None, types: list[type] | None = None
) -> list[list[str] | int]:
    """Feed ``reads`` (draining after those flagged), then flush: every result and ``pending``.

    ``types`` cycles the type each read is passed as; a mutable read is overwritten as soon as
    ``feed`` returns, which must not change anything.
    """
    log: list[list[str] | int] = []
    for i, read in enumerate(reads):
        kind = types[i % len(types)] if types else bytes
        data = kind(bytearray(read)) if kind is memoryview else kind(read)
        log += [chunker.feed(data), chunker.pending]
        if not isinstance(data, bytes):
            data[:] = b"\xff" * len(data)
        if drains and drains[i % len(drains)]:
            log += [chunker.drain(), chunker.pending]
    log += [chunker.flush(), chunker.pending]
    return log


def joined(log: list[list[str] | int]) -> list[str]:
    return [chunk for entry in log if isinstance(entry, list) for chunk in entry]


# --- an independent restatement of the rules, built on probing the strict decoder -------------

_COMPLETIONS = [lead + b"\x80" * k for lead in (b"", b"\x80", b"\x90", b"\xa0") for k in range(4)]


@functools.cache
def _completable(prefix: bytes) -> bool:
    """Whether some bytes complete ``prefix`` into exactly one valid character."""
    for tail in _COMPLETIONS:
        try:
            if len((prefix + tail).decode("utf-8")) == 1:
                return True
        except UnicodeDecodeError:
            pass
    return False


def units(data: bytes) -> list[tuple[int, int, int]]:
    """``(start, length, wire size)`` of each step of a whole-stream decode (size negated: U+FFFD)."""
    out, pos = [], 0
    while pos < len(data):
        for size in (1, 2, 3, 4):
            try:
                if len(data[pos : pos + size].decode("utf-8")) == 1:
                    out.append((pos, size, size))
                    break
            except UnicodeDecodeError:
                pass
        else:
            size = max(
                [k for k in (1, 2, 3) if pos + k <= len(data) and _completable(data[pos : pos + k])] or [1]
            )
            out.append((pos, size, -3))
        pos += out[-1][1]
    return out


def open_tail(data: bytes) -> int:
    """Bytes ``drain`` keeps back: a final step that is a completable prefix, not yet a character."""
    if not data:
        return 0
    start, size, cost = units(data)[-1]
    return size if cost < 0 and start + size == len(data) and _completable(data[start:]) else 0


def reference(data: bytes, limit: int, window: int) -> list[str]:
    """The chunks of ``data`` fed whole and then flushed, by the documented cutting rule."""
    steps = units(data)
    index = {start: i for i, (start, _, _) in enumerate(steps)}
    chunks, start = [], 0
    while start < len(data):
        i, pos, out = index[start], start, 0
        while i < len(steps) and out + abs(steps[i][2]) <= limit:
            out += abs(steps[i][2])
            pos += steps[i][1]
            i += 1
        cut = pos
        if i < len(steps) and window:  # the step at pos does not fit: the chunk is full
            nl = data.rfind(b"\n", max(start, pos - window), pos)
            if nl >= 0:
                cut = nl + 1
            elif data[pos - 1 : pos + 1] == b"\r\n":
                cut = pos - 1
        chunks.append(data[start:cut].decode("utf-8", "replace"))
        start = cut
    return chunks


@functools.cache
def short_sequences() -> list[tuple[bytes, dict[bytes, list[str]], int]]:
    """Every 1- to 3-byte sequence over the bytes where the UTF-8 ranges change (4-byte ones over
    fewer bytes), with the chunks (``max_chunk=4``, no window) of it alone and followed by ASCII,
    and the bytes ``drain`` keeps."""
    edges = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
             0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]  # fmt: skip
    few = [0x41, 0x80, 0x8F, 0x90, 0xBF, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xF5]
    table = []
    for alphabet, length in [(edges, 1), (edges, 2), (edges, 3), (few, 4)]:
        for seq in itertools.product(alphabet, repeat=length):
            raw = bytes(seq)
            table.append((raw, {d: reference(d, 4, 0) for d in (raw, raw + b"A")}, open_tail(raw)))
    return table


# --- unit cases ---------------------------------------------------------------------------------


class TestConstruction:
    def test_defaults(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        assert chunking.DEFAULT_MAX_CHUNK == 64 * 1024
        assert ch.max_chunk == 65536 and ch.newline_window == 8192 and ch.pending == 0

    def test_keywords(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(max_chunk=10, newline_window=0)
        assert (ch.max_chunk, ch.newline_window) == (10, 0)
        assert chunking.OutputChunker(9).newline_window == 1
        assert chunking.OutputChunker(4).newline_window == 0

    @pytest.mark.parametrize(
        ("args", "error", "message"),
        [
            ((3,), ValueError, r"max_chunk must be in \[4, 2\*\*31\), got 3"),
            ((0,), ValueError, r"max_chunk must be in \[4, 2\*\*31\), got 0"),
            ((-5,), ValueError, r"max_chunk must be in \[4, 2\*\*31\), got -5"),
            ((2**31,), ValueError, r"max_chunk must be in \[4, 2\*\*31\), got 2147483648"),
            ((16, 17), ValueError, r"newline_window must be in \[0, max_chunk\] = \[0, 16\], got 17"),
            ((16, -1), ValueError, r"newline_window must be in \[0, max_chunk\] = \[0, 16\], got -1"),
            ((16.0,), TypeError, "'float' object cannot be interpreted as an integer"),
            ((16, "2"), TypeError, "'str' object cannot be interpreted as an integer"),
        ],
    )
    def test_bad_arguments(self, chunking: ModuleType, args: tuple, error: type, message: str) -> None:
        with pytest.raises(error, match=message):
            chunking.OutputChunker(*args)

    def test_largest_limit_accepted(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(2**31 - 1, 0)
        assert ch.feed(b"abc") == [] and ch.flush() == ["abc"]


class TestFeedAndDrain:
    def test_small_reads_coalesce_until_drain(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        for i in range(100):
            assert ch.feed(b"line %03d\n" % i) == []
        assert ch.pending == 900
        assert ch.drain() == ["".join(f"line {i:03d}\n" for i in range(100))]
        assert ch.pending == 0 and ch.drain() == [] and ch.flush() == []

    def test_accepts_any_bytes_like(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(8, 0)
        assert ch.feed(bytearray(b"abc")) == []
        assert ch.feed(memoryview(b"xxdefghij")[2:]) == ["abcdefgh"]
        wide = array.array("H")
        wide.frombytes(b"kl")
        assert ch.feed(wide) == [] and ch.pending == 4  # any format: the raw bytes count
        assert ch.flush() == ["ijkl"]

    def test_mutable_buffer_can_be_reused(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(8, 0)
        buf = bytearray(b"abcdefghij")
        assert ch.feed(buf) == ["abcdefgh"]
        buf[:] = b"XXXXXXXXXX"
        assert ch.feed(memoryview(buf)[:1]) == [] and ch.drain() == ["ijX"]

    def test_bytes_reads_interleaved_with_other_buffers(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 0)
        big = b"0123456789" * 3 + EMOJI[:2]  # 16 bytes out; 14 and half an emoji kept
        assert ch.feed(big) == ["0123456789012345"] and ch.pending == 16
        assert ch.feed(bytearray(EMOJI[2:] + b"!")) == ["67890123456789"]
        assert ch.pending == 5 and ch.drain() == ["\U0001f600!"] and ch.pending == 0

    @pytest.mark.parametrize("bad", ["text", 7, None, memoryview(b"abcdef")[::2]])
    def test_rejects_non_bytes(self, chunking: ModuleType, bad: object) -> None:
        ch = chunking.OutputChunker(8)
        ch.feed(b"ok")
        name = type(bad).__name__
        with pytest.raises(TypeError, match=rf"^feed\(\) needs a contiguous bytes-like object, not '{name}'$"):
            ch.feed(bad)  # type: ignore[arg-type]
        assert ch.pending == 2 and ch.flush() == ["ok"]

    def test_bulk_read_splits_at_the_limit(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 0)
        assert ch.feed(b"0123456789abcdef" * 3 + b"xyz") == ["0123456789abcdef"] * 3
        assert ch.pending == 3 and ch.drain() == ["xyz"]

    def test_exactly_full_waits_for_the_next_byte(self, chunking: ModuleType) -> None:
        # A chunk is emitted by feed once the next character is known not to fit.
        ch = chunking.OutputChunker(8, 0)
        assert ch.feed(b"abcdefgh") == [] and ch.pending == 8
        assert ch.feed(b"i") == ["abcdefgh"] and ch.pending == 1

    def test_empty_read(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(8)
        assert ch.feed(b"") == [] and ch.drain() == [] and ch.flush() == []

    def test_pending_is_bounded(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(64)
        data = ("x" * 50 + "\u00e9\n" + "\U0001f600" * 3).encode() * 40
        for i in range(0, len(data), 7):
            ch.feed(data[i : i + 7])
            assert ch.pending <= 64 + 3
        ch.feed(EMOJI[:3])
        ch.drain()
        assert ch.pending == 3

    def test_large_stream_not_recopied(self, chunking: ModuleType) -> None:
        # 7 MiB in 4 KiB reads, then in one read. Re-copying the pending bytes on every feed would
        # make this crawl; what is asserted is the result, identical whatever the read sizes.
        data = b"".join(b"%07d " % i + "\u00e9\u20ac\U0001f600".encode() + b"\n" for i in range(400_000))
        ch = chunking.OutputChunker()
        got = []
        for i in range(0, len(data), 4096):
            got += ch.feed(data[i : i + 4096])
        got += ch.flush()
        assert "".join(got) == data.decode() and all(0 < wire(c) <= 65536 for c in got)
        whole = chunking.OutputChunker()
        assert whole.feed(data) + whole.flush() == got


class TestNewlines:
    def test_newline_exactly_at_the_limit(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 15 + b"\nbbbbb") == ["a" * 15 + "\n"]
        assert ch.drain() == ["bbbbb"]

    def test_newline_inside_the_window(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 12 + b"\nbbbbbbbb") == ["a" * 12 + "\n"]
        assert ch.pending == 8

    def test_newline_before_the_window(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 11 + b"\nbbbbbbbbb") == ["a" * 11 + "\nbbbb"]

    def test_last_newline_in_the_window_wins(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 8)
        assert ch.feed(b"aaaaaaaaa\nb\nccccccc") == ["aaaaaaaaa\nb\n"]

    def test_window_zero_ignores_newlines(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 0)
        assert ch.feed(b"a" * 14 + b"\nbbb") == ["a" * 14 + "\nb"]

    def test_crlf_straddling_the_limit_stays_whole(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 15 + b"\r\nbb") == ["a" * 15]
        assert ch.drain() == ["\r\nbb"]

    def test_crlf_before_the_limit(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 14 + b"\r\nbb") == ["a" * 14 + "\r\n"]

    def test_lone_cr_at_the_limit_stays(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"a" * 15 + b"\rbb") == ["a" * 15 + "\r"]

    def test_crlf_without_window_is_split(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 0)
        assert ch.feed(b"a" * 15 + b"\r\nbb") == ["a" * 15 + "\r"]

    def test_newline_cut_does_not_split_characters(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 16)
        data = "\u00e9\n".encode() + EMOJI * 4
        assert ch.feed(data) == ["\u00e9\n"] and ch.flush() == ["\U0001f600" * 4]


class TestUtf8:
    @pytest.mark.parametrize("k", [13, 14, 15])
    def test_emoji_straddling_the_limit(self, chunking: ModuleType, k: int) -> None:
        # The emoji's 4 bytes start 3, 2 or 1 bytes before the limit: it moves whole to the next chunk.
        ch = chunking.OutputChunker(16, 0)
        assert ch.feed(b"a" * k + EMOJI + b"z") == ["a" * k]
        assert ch.pending == 5 and ch.flush() == ["\U0001f600z"]

    def test_emoji_ending_exactly_at_the_limit(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(16, 0)
        assert ch.feed(b"a" * 12 + EMOJI + b"z") == ["a" * 12 + "\U0001f600"]
        assert ch.flush() == ["z"]

    def test_incomplete_character_held_back_by_drain(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        assert ch.feed(b"ab" + EMOJI[:2]) == []
        assert ch.drain() == ["ab"] and ch.pending == 2
        assert ch.feed(EMOJI[2:]) == [] and ch.drain() == ["\U0001f600"]

    @pytest.mark.parametrize("tail", [b"\xe0\x80", b"\xed\xa0", b"\xf4\x90", b"\xf0\x8f", b"\xc0", b"\x80"])
    def test_drain_emits_sequences_that_cannot_complete(self, chunking: ModuleType, tail: bytes) -> None:
        # Only a prefix some bytes could still turn into a character is kept back; ED A0 is a
        # surrogate even though CPython's incremental decoder waits on it.
        ch = chunking.OutputChunker()
        ch.feed(b"ab" + tail)
        assert ch.drain() == [("ab" + tail.decode("utf-8", "replace"))] and ch.pending == 0

    def test_flush_replaces_incomplete_tail(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        ch.feed(b"ab" + EMOJI[:3])
        assert ch.flush() == ["ab" + FFFD] and ch.pending == 0
        assert ch.feed(b"again") == [] and ch.flush() == ["again"]  # reusable

    def test_flush_tail_may_need_its_own_chunk(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(4)
        ch.feed(b"abc" + EMOJI[:2])
        assert ch.drain() == ["abc"] and ch.flush() == [FFFD]
        ch.feed(b"abc" + EMOJI[:2])
        assert ch.flush() == ["abc", FFFD]

    def test_truncated_sequence_is_one_replacement(self, chunking: ModuleType) -> None:
        data = EMOJI[:3] + b"A" + EMOJI[:2] + b"\n"
        assert data.decode("utf-8", "replace") == FFFD + "A" + FFFD + "\n"
        for reads in ([data], [bytes([b]) for b in data]):
            ch = chunking.OutputChunker(4)
            assert joined(session(ch, reads, [True])) == [FFFD + "A", FFFD + "\n"]

    def test_only_invalid_bytes(self, chunking: ModuleType) -> None:
        # Each 0xFF is one U+FFFD: 3 bytes on the wire for 1 byte in, so 5 fit in 16.
        ch = chunking.OutputChunker(16, 4)
        assert ch.feed(b"\xff" * 12) == [FFFD * 5, FFFD * 5]
        assert ch.pending == 2 and ch.flush() == [FFFD * 2]

    def test_lone_continuation_byte(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        ch.feed(b"a\x80b")
        assert ch.drain() == ["a" + FFFD + "b"]

    def test_surrogate_and_overlong_encodings(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker()
        ch.feed(b"\xed\xa0\x80|\xc0\xaf|\xf4\x90\x80\x80")
        assert ch.drain() == [FFFD * 3 + "|" + FFFD * 2 + "|" + FFFD * 4]

    def test_max_chunk_four(self, chunking: ModuleType) -> None:
        ch = chunking.OutputChunker(4)
        data = b"a" + EMOJI + EMOJI + "\u00e9".encode() + b"\xff\xff"
        assert ch.feed(data) == ["a", "\U0001f600", "\U0001f600", "\u00e9", FFFD]
        assert ch.pending == 1 and ch.flush() == [FFFD]

    def test_max_chunk_four_every_split(self, chunking: ModuleType) -> None:
        data = b"a" + EMOJI + b"\xe2\x82" + b"\xff" + "\u00e9".encode() + EMOJI[:3]
        expected = ["a", "\U0001f600", FFFD, FFFD, "\u00e9", FFFD]
        for cut in range(len(data) + 1):
            ch = chunking.OutputChunker(4)
            assert joined(session(ch, [data[:cut], data[cut:]])) == expected

    def test_every_short_sequence_matches_the_decoder(self, chunking: ModuleType) -> None:
        # Chunk boundaries, held-back tails and text against the restated rules.
        small, large = chunking.OutputChunker(4, 0), chunking.OutputChunker()
        for raw, expected, kept in short_sequences():
            for data in (raw, raw + b"A"):
                assert small.feed(data) + small.flush() == expected[data], data
            text = raw[: len(raw) - kept].decode("utf-8", "replace")
            for ch in (small, large):  # cutting at every step, and the whole tick as one chunk
                assert "".join(ch.feed(raw) + ch.drain()) == text and ch.pending == kept, raw
                assert ch.flush() == ([FFFD] if kept else [])


# --- properties -----------------------------------------------------------------------------------


class TestProperties:
    @PROPERTY
    @given(text, cuts, st.lists(st.booleans(), max_size=5), sizes, st.data())
    def test_valid_text_survives_any_reads(
        self, chunking: ModuleType, s: str, points: list[int], drains: list[bool], limit: int, data: st.DataObject
    ) -> None:
        window = data.draw(st.integers(0, limit))
        raw = s.encode()
        chunks = joined(session(chunking.OutputChunker(limit, window), split_points(raw, points), drains))
        assert "".join(chunks) == s
        assert all(chunk and wire(chunk) <= limit for chunk in chunks)

    @PROPERTY
    @given(messy, cuts, st.lists(st.booleans(), max_size=5), sizes, kinds, st.data())
    def test_any_bytes_join_to_the_whole_stream_decode(
        self,
        chunking: ModuleType,
        raw: bytes,
        points: list[int],
        drains: list[bool],
        limit: int,
        types: list[type],
        data: st.DataObject,
    ) -> None:
        window = data.draw(st.integers(0, limit))
        ch = chunking.OutputChunker(limit, window)
        chunks: list[str] = []
        for i, read in enumerate(split_points(raw, points)):
            chunks += ch.feed(types[i % len(types)](read))
            assert ch.pending <= limit + 3
            if drains and drains[i % len(drains)]:
                chunks += ch.drain()
                assert ch.pending <= 3
        chunks += ch.flush()
        assert "".join(chunks) == raw.decode("utf-8", "replace")
        assert all(chunk and wire(chunk) <= limit for chunk in chunks)

    @PROPERTY
    @given(st.one_of(messy, text.map(str.encode), lines.map(str.encode)), cuts, sizes, st.data())
    def test_boundaries_follow_the_rule_whatever_the_reads(
        self, chunking: ModuleType, raw: bytes, points: list[int], limit: int, data: st.DataObject
    ) -> None:
        window = data.draw(st.integers(0, limit))
        expected = reference(raw, limit, window)
        assert joined(session(chunking.OutputChunker(limit, window), split_points(raw, points))) == expected
        assert joined(session(chunking.OutputChunker(limit, window), [raw])) == expected

    @settings(max_examples=50, deadline=None)
    @given(messy, sizes)
    def test_one_byte_at_a_time_equals_all_at_once(self, chunking: ModuleType, raw: bytes, limit: int) -> None:
        whole = session(chunking.OutputChunker(limit), [raw])
        single = session(chunking.OutputChunker(limit), [bytes([b]) for b in raw])
        assert joined(single) == joined(whole)
        drained = session(chunking.OutputChunker(limit), [bytes([b]) for b in raw], [True])
        assert "".join(joined(drained)) == "".join(joined(whole)) == raw.decode("utf-8", "replace")


class TestTwinParity:
    """Each twin against the other; only collected in a normal build (see the module end)."""

    @staticmethod
    def other(chunking: ModuleType) -> ModuleType:
        return twin("chunking", "py" if chunking is twin("chunking", "c") else "c")

    def test_same_public_api(self, chunking: ModuleType) -> None:
        assert_same_api("chunking")
        assert sorted(chunking.__all__) == sorted(n for n in facade.__all__ if n != "IMPLEMENTATION")
        assert facade.OutputChunker is twin("chunking", facade.IMPLEMENTATION).OutputChunker

    @PROPERTY
    @given(messy, cuts, st.lists(st.booleans(), max_size=5), st.integers(4, 200), kinds, st.data())
    def test_same_chunks_on_arbitrary_bytes(
        self,
        chunking: ModuleType,
        raw: bytes,
        points: list[int],
        drains: list[bool],
        limit: int,
        types: list[type],
        data: st.DataObject,
    ) -> None:
        window = data.draw(st.one_of(st.none(), st.integers(0, limit)))
        reads = split_points(raw, points)
        ours = session(chunking.OutputChunker(limit, window), reads, drains, types)
        assert ours == session(self.other(chunking).OutputChunker(limit, window), reads, drains, types)

    @pytest.mark.parametrize("limit", [4096, 65536])
    def test_same_chunks_on_a_long_stream(self, chunking: ModuleType, limit: int) -> None:
        # Long valid runs, lines longer than the limit, stray invalid bytes, random reads and ticks.
        rnd = random.Random(limit)
        words = "\u043b\u043e\u0433 \u6784\u5efa \U0001f680\n".encode()
        pieces = [b"x" * 5000 + b"\n", words, b"\xff\xfe", EMOJI[:3]]
        raw = b"".join(rnd.choice(pieces) * rnd.randint(1, 40) for _ in range(300))
        points = [rnd.randrange(len(raw)) for _ in range(400)]
        drains = [rnd.random() < 0.3 for _ in range(17)]
        reads = split_points(raw, points)
        ours = session(chunking.OutputChunker(limit), reads, drains, [bytes, bytearray])
        assert ours == session(self.other(chunking).OutputChunker(limit), reads, drains, [bytes, bytearray])
        assert "".join(joined(ours)) == raw.decode("utf-8", "replace")

    @PROPERTY
    @given(
        st.one_of(st.integers(-3, 12), st.sampled_from([2**31 - 1, 2**31, 2**64, 4.0, "8", None, True])),
        st.one_of(st.none(), st.integers(-2, 14), st.sampled_from([2**63, 1.5, b"1"])),
    )
    def test_same_errors_on_bad_arguments(self, chunking: ModuleType, limit: object, window: object) -> None:
        def outcome(mod: ModuleType) -> tuple:
            try:
                ch = mod.OutputChunker(limit, window)
            except Exception as exc:  # noqa: BLE001 -- comparing whatever is raised is the point
                return type(exc), str(exc)
            return ch.max_chunk, ch.newline_window

        assert outcome(chunking) == outcome(self.other(chunking))

    @pytest.mark.parametrize("bad", ["s", 1, None, 2.5, memoryview(b"abcd")[::2], [1, 2]])
    def test_same_error_on_bad_data(self, chunking: ModuleType, bad: object) -> None:
        errors = []
        for mod in (chunking, self.other(chunking)):
            with pytest.raises(TypeError) as info:
                mod.OutputChunker().feed(bad)
            errors.append(str(info.value))
        assert errors[0] == errors[1]


if "c" not in IMPLEMENTATIONS:  # SMITH_FAST_NO_EXTENSIONS=1: there is no compiled twin to compare
    del TestTwinParity
