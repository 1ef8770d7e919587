"""Framing: the compiled twin against the Python twin, side by side (``[c]`` / ``[py]``).

Run: ``.venv/bin/pytest bench/bench_framing.py --benchmark-only``. Each benchmarked call processes a
whole stream, so per-frame costs are far above timer resolution.
"""

from __future__ import annotations

import random
from types import ModuleType

import pytest

SIZES = [16, 256, 4096, 65536]
N_SMALL = 2000


def _stream(framing: ModuleType, size: int, count: int) -> tuple[list[bytes], bytes]:
    rnd = random.Random(size)
    msgs = [rnd.randbytes(size) for _ in range(count)]
    return msgs, framing.encode_frames(msgs)


@pytest.mark.parametrize("size", SIZES)
def test_decode_whole_stream(benchmark, framing: ModuleType, impl: str, size: int) -> None:  # type: ignore[no-untyped-def]
    """A read that brings many complete frames at once (the common case on a busy socket)."""
    count = max(8, (1 << 20) // size)
    msgs, data = _stream(framing, size, count)
    benchmark.group = f"framing decode {size} B x {count}"
    benchmark.extra_info["frames"] = count
    frames = benchmark(lambda: framing.FrameDecoder().feed(data))
    assert frames == msgs


@pytest.mark.parametrize("size", [16, 256])
def test_decode_whole_stream_steady(benchmark, framing: ModuleType, impl: str, size: int) -> None:  # type: ignore[no-untyped-def]
    """As ``test_decode_whole_stream``, holding the previous call's frames until this one returns.

    Dropping every frame between calls (the case above) empties pymalloc's arenas, which go back to
    the OS; the next call then faults fresh pages in for 65,536 small bytes objects, about 20 ns a
    frame that either twin pays (``perf stat -e page-faults``: ~770 a call against ~0). A service
    that holds the frames of one read while the next arrives, as every real consumer does for a
    moment, runs in this steady state.
    """
    count = max(8, (1 << 20) // size)
    msgs, data = _stream(framing, size, count)
    benchmark.group = f"framing decode {size} B x {count}, steady state"
    held: list[list[bytes]] = [[]]

    def run() -> list[bytes]:
        frames: list[bytes] = framing.FrameDecoder().feed(data)
        held[0] = frames  # the previous call's frames are released only now
        return frames

    assert benchmark(run) == msgs


def test_decode_split_reads(benchmark, framing: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """80-byte frames arriving in 1000-byte reads: frames straddle every read boundary."""
    msgs, data = _stream(framing, 80, 12_000)
    reads = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    benchmark.group = "framing decode 80 B frames in 1000 B reads"

    def run() -> int:
        dec = framing.FrameDecoder()
        n = 0
        for r in reads:
            n += len(dec.feed(r))
        return n

    assert benchmark(run) == len(msgs)


def test_decode_large_frame_small_reads(benchmark, framing: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """One 8 MiB frame delivered in 64 KiB reads: the gather path."""
    body = random.Random(1).randbytes(8 << 20)
    data = framing.encode_frame(body)
    reads = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    benchmark.group = "framing decode 8 MiB frame in 64 KiB reads"

    def run() -> list[bytes]:
        dec = framing.FrameDecoder()
        out: list[bytes] = []
        for r in reads:
            out += dec.feed(r)
        return out

    assert benchmark(run) == [body]


@pytest.mark.parametrize("size", [16, 256, 4096])
def test_encode_frames(benchmark, framing: ModuleType, impl: str, size: int) -> None:  # type: ignore[no-untyped-def]
    msgs, data = _stream(framing, size, N_SMALL)
    benchmark.group = f"framing encode_frames {size} B x {N_SMALL}"
    assert benchmark(framing.encode_frames, msgs) == data


def test_encode_into_reused_buffer(benchmark, framing: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    msgs, data = _stream(framing, 100, N_SMALL)
    buf = bytearray()
    benchmark.group = f"framing encode_into 100 B x {N_SMALL}"
    assert benchmark(framing.encode_into, msgs, buf, 0) == len(data)
    assert bytes(buf) == data
