"""Varint-delimited framing: both twins, against protobuf's own delimited encoding."""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast import _framing_py, framing as facade
from smith_fast.errors import FramingError, FrameTooLarge, SmithFastError
from smith_fast.pb import smith_pb2

from .conftest import IMPLEMENTATIONS, assert_same_api, twin

payloads = st.lists(st.binary(max_size=300), max_size=20)


def split_points(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def feed_all(decoder, parts) -> list[bytes]:  # type: ignore[no-untyped-def]
    frames: list[bytes] = []
    for part in parts:
        frames.extend(decoder.feed(part))
    return frames


def outcome(mod: ModuleType, parts: list[bytes], max_frame_size: int = 1 << 20):  # type: ignore[no-untyped-def]
    """Everything observable about decoding ``parts``: frames, or frames before the error and the error."""
    dec = mod.FrameDecoder(max_frame_size)
    frames: list[bytes] = []
    for part in parts:
        try:
            frames.extend(dec.feed(part))
        except FramingError as exc:
            frames.extend(exc.frames)
            return frames, (type(exc), str(exc), exc.offset), dec.offset
    return frames, None, (dec.offset, dec.buffered, dec.pending_size)


class TestEncoding:
    def test_matches_protobuf_delimited(self, framing: ModuleType) -> None:
        env = smith_pb2.Envelope(timestamp=1_700_000_000_000, sequence=7)
        env.event.log.message = "x" * 300
        body = env.SerializeToString()
        assert framing.encode_frame(body) == _VarintBytes(len(body)) + body

    @given(st.integers(0, 2**64 - 1))
    def test_varint_matches_protobuf(self, framing: ModuleType, value: int) -> None:
        assert framing.encode_varint(value) == _VarintBytes(value)
        assert framing.varint_size(value) == len(_VarintBytes(value))

    @pytest.mark.parametrize("value", [-1, 2**64, 2**70])
    def test_varint_out_of_range(self, framing: ModuleType, value: int) -> None:
        with pytest.raises(OverflowError, match=r"varint value must be in \[0, 2\*\*64\)"):
            framing.encode_varint(value)

    @given(payloads)
    def test_encode_frames_is_concatenation(self, framing: ModuleType, msgs: list[bytes]) -> None:
        joined = b"".join(framing.encode_frame(m) for m in msgs)
        assert framing.encode_frames(msgs) == joined
        assert framing.encode_frames(iter(msgs)) == joined
        assert framing.encode_frames([bytearray(m) for m in msgs]) == joined
        assert framing.encode_frames([memoryview(m) for m in msgs]) == joined

    def test_encode_into_reuses_buffer(self, framing: ModuleType) -> None:
        buf = bytearray(b"HEADER-and-stale-bytes")
        end = framing.encode_into([b"ab", b"c"], buf, 6)
        assert end == len(buf) == 6 + 3 + 2
        assert bytes(buf) == b"HEADER\x02ab\x01c"
        end = framing.encode_into([b"z"], buf, -1)
        assert bytes(buf) == b"HEADER\x02ab\x01c\x01z" and end == len(buf)
        with pytest.raises(ValueError, match="offset 99 is outside the buffer"):
            framing.encode_into([b"z"], buf, 99)

    def test_large_frame_prefix(self, framing: ModuleType) -> None:
        body = b"\x00" * 70_000
        frame = framing.encode_frame(body)
        assert frame[:3] == _VarintBytes(70_000) and frame[3:] == body


class TestDecoding:
    def test_empty_and_zero_length_frames(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder()
        assert dec.feed(b"") == []
        assert dec.feed(b"\x00\x00\x01a") == [b"", b"", b"a"]
        assert dec.offset == 4 and dec.buffered == 0

    def test_accepts_any_bytes_like(self, framing: ModuleType) -> None:
        data = framing.encode_frames([b"hello", b"world"])
        for kind in (bytes, bytearray, memoryview):
            assert framing.FrameDecoder().feed(kind(data)) == [b"hello", b"world"]

    def test_byte_at_a_time(self, framing: ModuleType) -> None:
        msgs = [b"a" * n for n in (0, 1, 127, 128, 300, 16_384, 70_000)]
        data = framing.encode_frames(msgs)
        dec = framing.FrameDecoder()
        got = feed_all(dec, [data[i : i + 1] for i in range(len(data))])
        assert got == msgs and dec.offset == len(data) and dec.buffered == 0

    def test_partial_state_is_reported(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder()
        data = framing.encode_frame(b"x" * 200)  # two-byte prefix
        assert dec.feed(data[:1]) == [] and dec.buffered == 1 and dec.offset == 0
        assert dec.feed(data[1:50]) == [] and dec.buffered == 50
        assert dec.feed(data[50:] + b"\x01") == [b"x" * 200]
        assert dec.offset == len(data) and dec.buffered == 1

    def test_interop_with_protobuf_parser(self, framing: ModuleType) -> None:
        envs = []
        for i in range(50):
            env = smith_pb2.Envelope(timestamp=i, sequence=i + 1)
            env.event.shell_output.request_id = "r"
            env.event.shell_output.stdout = "line %d\n" % i * i
            envs.append(env)
        stream = b"".join(_VarintBytes(e.ByteSize()) + e.SerializeToString() for e in envs)
        frames = framing.FrameDecoder().feed(stream)
        assert [smith_pb2.Envelope.FromString(f) for f in frames] == envs
        # and protobuf's varint reader agrees with our framing of the same messages
        ours = framing.encode_frames([e.SerializeToString() for e in envs])
        assert ours == stream
        size, pos = _DecodeVarint(ours, 0)
        assert size == envs[0].ByteSize() and pos == 1

    def test_frame_too_large_before_payload(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder(max_frame_size=100)
        ok = framing.encode_frame(b"a" * 100)
        with pytest.raises(FrameTooLarge) as info:
            dec.feed(ok + _VarintBytes(101))  # only the prefix: nothing of the payload has arrived
        exc = info.value
        assert (exc.offset, exc.size, exc.limit) == (len(ok), 101, 100)
        assert str(exc) == f"frame at byte offset {len(ok)} declares 101 bytes, above max_frame_size 100"
        assert exc.frames == [b"a" * 100]
        assert dec.buffered == 0
        assert isinstance(exc, FramingError) and isinstance(exc, ValueError)
        assert isinstance(exc, SmithFastError)

    def test_errors_are_sticky(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder(max_frame_size=10)
        with pytest.raises(FrameTooLarge) as first:
            dec.feed(b"\x01a\x0b")
        assert first.value.frames == [b"a"]
        for data in (b"", b"\x01a"):
            with pytest.raises(FrameTooLarge) as again:
                dec.feed(data)
            assert str(again.value) == str(first.value) and again.value.frames == []

    def test_varint_longer_than_ten_bytes(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder()
        assert dec.feed(b"\x00" + b"\x80" * 9) == [b""]  # nine continuation bytes: still undecided
        with pytest.raises(FramingError, match="at byte offset 1 is longer than 10 bytes") as info:
            dec.feed(b"\x80")
        assert info.value.offset == 1 and type(info.value) is FramingError

    def test_ten_byte_varint_with_small_value_is_accepted(self, framing: ModuleType) -> None:
        # protobuf parsers accept redundant continuation groups; so do we
        assert framing.FrameDecoder().feed(b"\x83" + b"\x80" * 8 + b"\x00abc") == [b"abc"]

    @pytest.mark.parametrize(
        "prefix", [_VarintBytes(2**32), _VarintBytes(2**63), b"\xff" * 9 + b"\x01", b"\x80\x80\x80\x80\x10"]
    )
    def test_length_wider_than_32_bits(self, framing: ModuleType, prefix: bytes) -> None:
        with pytest.raises(FramingError, match="at byte offset 0 does not fit in 32 bits"):
            framing.FrameDecoder(max_frame_size=2**32 - 1).feed(prefix)

    def test_max_frame_size_validated(self, framing: ModuleType) -> None:
        for bad in (-1, 2**32):
            with pytest.raises(ValueError, match=r"max_frame_size must be in \[0, 2\*\*32\)"):
                framing.FrameDecoder(bad)
        assert framing.FrameDecoder().max_frame_size == framing.DEFAULT_MAX_FRAME_SIZE == 16 * 1024 * 1024

    def test_large_frame_not_recopied(self, framing: ModuleType) -> None:
        # A 64 MiB frame in 4 KiB feeds would be ~550 GB of copying if each feed re-copied the
        # buffer; with amortised appends it completes quickly. Correctness is what we assert.
        body = bytes(range(256)) * (64 * 1024 * 4)
        data = framing.encode_frame(body)
        dec = framing.FrameDecoder(max_frame_size=len(body))
        got = feed_all(dec, (data[i : i + 4096] for i in range(0, len(data), 4096)))
        assert got == [body]


class TestArrivedBytes:
    """A declared length is a promise, not a reservation: memory follows the bytes that arrived
    (before: 150 unauthenticated connections declaring 16 MiB each took 1.7 GB)."""

    def test_declared_length_reserves_nothing(self, framing: ModuleType) -> None:
        import tracemalloc

        declared = 16 * 1024 * 1024 - 1
        dec = framing.FrameDecoder(max_frame_size=declared)
        chunk = framing.encode_varint(declared) + b"\0" * 4096
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            assert dec.feed(chunk) == []
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < 256 * 1024, f"{peak} bytes held for 4 KiB that arrived"
        assert dec.pending_size == declared and dec.buffered == 4 + 4096

    def test_growth_follows_arrivals_and_completes(self, framing: ModuleType) -> None:
        import tracemalloc

        body = bytes(range(256)) * 4096  # 1 MiB
        data = framing.encode_frame(body)
        dec = framing.FrameDecoder(max_frame_size=4 * len(body))
        tracemalloc.start()
        try:
            for sent in (10, 50_000, 300_000):
                chunk = data[:sent]
                dec = framing.FrameDecoder(max_frame_size=4 * len(body))
                tracemalloc.reset_peak()
                base, _ = tracemalloc.get_traced_memory()
                assert dec.feed(chunk) == []
                peak = tracemalloc.get_traced_memory()[1] - base
                assert peak < 2 * sent + 64 * 1024, (sent, peak)
        finally:
            tracemalloc.stop()
        assert dec.feed(data[300_000:]) == [body] and dec.pending_size == 0 and dec.buffered == 0

    def test_pending_size(self, framing: ModuleType) -> None:
        dec = framing.FrameDecoder()
        data = framing.encode_frame(b"x" * 200)
        assert dec.feed(data[:1]) == [] and dec.pending_size == 0  # the prefix is not complete yet
        assert dec.feed(data[1:3]) == [] and dec.pending_size == 200
        assert dec.feed(data[3:]) == [b"x" * 200] and dec.pending_size == 0
        with pytest.raises(FrameTooLarge):
            framing.FrameDecoder(100).feed(data)

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.sampled_from([0, 1, 16_383, 16_384, 16_385, 40_000, 100_000]), min_size=1, max_size=4),
        st.lists(st.integers(0, 400_000), max_size=20),
    )
    def test_large_frames_any_split(self, framing: ModuleType, sizes: list[int], cuts: list[int]) -> None:
        msgs = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
        data = framing.encode_frames(msgs)
        dec = framing.FrameDecoder()
        assert feed_all(dec, split_points(data, cuts)) == msgs
        assert dec.offset == len(data) and dec.buffered == 0 and dec.pending_size == 0


class TestProperties:
    @settings(max_examples=200)
    @given(payloads, st.lists(st.integers(0, 10_000), max_size=30))
    def test_any_split_gives_same_frames(self, framing: ModuleType, msgs: list[bytes], cuts: list[int]) -> None:
        data = framing.encode_frames(msgs)
        dec = framing.FrameDecoder()
        assert feed_all(dec, split_points(data, cuts)) == msgs
        assert dec.offset == len(data) and dec.buffered == 0

    @settings(max_examples=200)
    @given(payloads, st.integers(0, 10_000))
    def test_truncated_stream_holds_the_rest(self, framing: ModuleType, msgs: list[bytes], cut: int) -> None:
        data = framing.encode_frames(msgs)
        cut %= len(data) + 1
        dec = framing.FrameDecoder()
        got = dec.feed(data[:cut])
        assert got == msgs[: len(got)]
        assert dec.offset + dec.buffered == cut
        assert got + dec.feed(data[cut:]) == msgs


class TestTwinParity:
    """Only collected in a normal build (see the module end): it needs both twins."""

    def test_same_public_api(self) -> None:
        assert_same_api("framing")
        assert sorted(twin("framing", "c").__all__) == sorted(n for n in facade.__all__ if n != "IMPLEMENTATION")

    @settings(max_examples=300)
    @given(st.binary(max_size=400), st.lists(st.integers(0, 1000), max_size=12), st.integers(0, 300))
    def test_same_outcome_on_arbitrary_bytes(self, data: bytes, cuts: list[int], limit: int) -> None:
        parts = split_points(data, cuts)
        assert outcome(twin("framing", "c"), parts, limit) == outcome(twin("framing", "py"), parts, limit)

    @settings(max_examples=200)
    @given(
        st.lists(
            st.one_of(
                st.binary(max_size=40).map(_framing_py.encode_frame),
                st.sampled_from([b"\xff" * 11, _VarintBytes(2**32), _VarintBytes(5000), b"\x80" * 5]),
            ),
            max_size=8,
        ),
        st.lists(st.integers(0, 1000), max_size=8),
    )
    def test_same_outcome_on_malformed_streams(self, chunks: list[bytes], cuts: list[int]) -> None:
        parts = split_points(b"".join(chunks), cuts)
        assert outcome(twin("framing", "c"), parts, 4096) == outcome(twin("framing", "py"), parts, 4096)


if "c" not in IMPLEMENTATIONS:  # SMITH_FAST_NO_EXTENSIONS=1: there is no compiled twin to compare
    del TestTwinParity
