"""Shell-output chunking: the compiled twin against the Python twin, side by side (``[c]`` / ``[py]``).

Run: ``.venv/bin/pytest bench/bench_chunking.py --benchmark-only -p no:cacheprovider``. Each
benchmarked call pushes a whole stream through a fresh chunker the way the service does: ``feed``
per read, ``drain`` per event-loop tick, ``flush`` at the end.
"""

from __future__ import annotations

import random
from types import ModuleType

import pytest

LINE = 80
MIXED_WORDS = ["build", "ok", "\u0441\u0431\u043e\u0440\u043a\u0430", "\u6784\u5efa\u5b8c\u6210",
               "\u00e9t\u00e9", "\U0001f680", "\u2714", "warn:", "\u03bb", "path/to/file.py"]  # fmt: skip


def _log_text(size: int, seed: int, words: list[str]) -> bytes:
    """Log-like output of about ``size`` bytes: lines of random words, each ending in a newline."""
    rnd = random.Random(seed)
    out: list[str] = []
    total = 0
    while total < size:
        line = " ".join(rnd.choice(words) for _ in range(rnd.randint(3, 14))) + "\n"
        out.append(line)
        total += len(line.encode())
    return "".join(out).encode()


def _lines(count: int) -> list[bytes]:
    rnd = random.Random(80)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 =:/."
    return [("".join(rnd.choice(alphabet) for _ in range(LINE - 1)) + "\n").encode() for _ in range(count)]


def _stream(chunking: ModuleType, ticks: list[list[bytes]]) -> list[str]:
    chunker = chunking.OutputChunker()
    chunks: list[str] = []
    for reads in ticks:
        for read in reads:
            chunks += chunker.feed(read)
        chunks += chunker.drain()
    flushed: list[str] = chunker.flush()
    return chunks + flushed


def _ticks(data: bytes, read: int, reads_per_tick: int) -> list[list[bytes]]:
    reads = [data[i : i + read] for i in range(0, len(data), read)]
    return [reads[i : i + reads_per_tick] for i in range(0, len(reads), reads_per_tick)]


def _check(chunks: list[str], data: bytes) -> None:
    assert "".join(chunks) == data.decode("utf-8", "replace")
    assert all(0 < len(c.encode()) <= 65536 for c in chunks)


@pytest.mark.benchmark(group="chunking (a) 80 B line reads, 32 per tick, drained")
def test_small_line_reads(benchmark, chunking: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """8192 reads of one 80-byte line each; every 32 reads one ``drain`` coalesces them into one chunk."""
    lines = _lines(8192)
    ticks = [lines[i : i + 32] for i in range(0, len(lines), 32)]
    benchmark.extra_info["reads"] = len(lines)
    chunks = benchmark(_stream, chunking, ticks)
    assert len(chunks) == len(ticks)
    _check(chunks, b"".join(lines))


@pytest.mark.benchmark(group="chunking (b) 64 KiB bulk reads, ASCII")
def test_bulk_reads(benchmark, chunking: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """4 MiB of ASCII log output in 64 KiB reads, one read per tick: each read gives about one chunk."""
    words = ["INFO", "compiling", "src/main.rs", "ok", "warning:", "unused", "variable", "`x`", "100%"]
    data = _log_text(4 << 20, 64, words)
    ticks = _ticks(data, 65536, 1)
    benchmark.extra_info["bytes"] = len(data)
    _check(benchmark(_stream, chunking, ticks), data)


@pytest.mark.benchmark(group="chunking (c) mixed multi-byte text, 4 KiB reads, 4 per tick")
def test_mixed_multibyte(benchmark, chunking: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """1 MiB of Cyrillic, CJK, accents and emoji among ASCII; reads split characters anywhere."""
    data = _log_text(1 << 20, 7, MIXED_WORDS)
    ticks = _ticks(data, 4093, 4)  # an odd read size: reads end inside characters
    benchmark.extra_info["bytes"] = len(data)
    _check(benchmark(_stream, chunking, ticks), data)


@pytest.mark.parametrize("read", [16, 256, 4096, 65536])
def test_read_size_ladder(  # type: ignore[no-untyped-def]
    benchmark, chunking: ModuleType, impl: str, read: int
) -> None:
    """256 KiB of mixed text at each read size, drained every 8 reads: the per-call overhead curve."""
    data = _log_text(256 << 10, read, MIXED_WORDS)
    benchmark.group = f"chunking read size ladder: {read} B reads, 256 KiB mixed text"
    _check(benchmark(_stream, chunking, _ticks(data, read, 8)), data)


@pytest.mark.benchmark(group="chunking (d) binary output: 256 KiB random bytes, 64 KiB reads")
def test_binary_output(benchmark, chunking: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    """``cat`` of a binary file: most bytes are invalid UTF-8 and each becomes a 3-byte U+FFFD."""
    data = random.Random(3).randbytes(256 << 10)
    _check(benchmark(_stream, chunking, _ticks(data, 65536, 1)), data)
