"""Fuzz the shell-output chunker, both twins in lockstep.

Input layout:

* byte 0: ``max_chunk``, an index into :data:`MAX_CHUNKS`;
* byte 1: ``newline_window``: 0 → ``None`` (the default, ``max_chunk // 8``), 1 → 0 (off),
  2 → ``max_chunk``, else ``byte % (max_chunk + 1)``;
* byte 2: the number ``n`` (mod 32) of operations, then ``n`` operation bytes; the rest is the
  output stream that the feeds consume in order. An operation byte ``op``: ``op >> 6`` 0 or 1 feed
  ``op & 0x3F`` bytes, 2 ``drain``, 3 with bit 0 set ``flush`` (ending one stream and starting the
  next) else feed ``37 * ((op >> 1) & 0x1F)`` bytes. The remaining bytes are fed, then flushed.

Checked on every input: both twins return the same chunks (and errors) from every call and hold
the same ``pending``; every chunk is a non-empty string of at most ``max_chunk`` UTF-8 bytes;
``pending`` stays within ``max_chunk + 3`` after ``feed``, 3 after ``drain``, 0 after ``flush``;
the chunks of each stream join up to ``stream.decode("utf-8", "replace")``; a chunk is only cut
short of ``max_chunk`` at a newline (or before a ``\\r\\n``); without ``drain`` the chunks do not
depend on the read sizes; a fed ``bytearray`` may be overwritten as soon as ``feed`` returns.
"""

from __future__ import annotations

from typing import Any

from fuzz._common import assert_same, fuzz_main, instrumented, outcome, twins

with instrumented(__name__):
    c, py = twins("chunking")

MAX_CHUNKS = (4, 5, 6, 7, 8, 9, 13, 16, 31, 64, 100, 255, 4096)
_FEED, _DRAIN, _FLUSH = "feed", "drain", "flush"


def parse(data: bytes) -> tuple[int, int | None, list[tuple[str, bytes]]] | None:
    """Decode the input layout: ``(max_chunk, newline_window, [(operation, bytes fed)])``."""
    if len(data) < 3:
        return None
    limit = MAX_CHUNKS[data[0] % len(MAX_CHUNKS)]
    w = data[1]
    window = None if w == 0 else 0 if w == 1 else limit if w == 2 else w % (limit + 1)
    n = data[2] % 32
    ops_bytes = data[3 : 3 + n]
    stream = data[3 + n :]
    pos = 0
    ops: list[tuple[str, bytes]] = []
    for op in ops_bytes:
        kind = op >> 6
        if kind == 2:
            ops.append((_DRAIN, b""))
            continue
        if kind == 3 and op & 1:
            ops.append((_FLUSH, b""))
            continue
        size = op & 0x3F if kind < 2 else 37 * ((op >> 1) & 0x1F)
        ops.append((_FEED, stream[pos : pos + size]))
        pos += size
    ops.append((_FEED, stream[pos:]))
    ops.append((_FLUSH, b""))
    return limit, window, ops


def _call(chunker: Any, op: str, piece: bytes, scratch: bytearray | None) -> Any:
    if op == _FEED:
        if scratch is None:
            return chunker.feed(piece)
        scratch[:] = piece
        result = chunker.feed(scratch)
        scratch[:] = b"\xff" * len(scratch)  # the caller reuses its buffer: the chunker must have copied
        return result
    return chunker.drain() if op == _DRAIN else chunker.flush()


def test_one_input(data: bytes) -> None:
    parsed = parse(data)
    if parsed is None:
        return
    limit, window, ops = parsed
    tc, tp = c.OutputChunker(limit, window), py.OutputChunker(limit, window)
    assert (tc.max_chunk, tc.newline_window) == (tp.max_chunk, tp.newline_window)
    mutable = bool(data[1] & 0x80)  # half of the inputs feed a reused bytearray
    segment: list[bytes] = []  # the current stream's reads
    results: list[tuple[str, list[str]]] = []
    drained = False
    for i, (op, piece) in enumerate(ops):
        rc = outcome(_call, tc, op, piece, bytearray() if mutable else None)
        rp = outcome(_call, tp, op, piece, bytearray() if mutable else None)
        assert_same(rc, rp, f"operation #{i} {op}({len(piece)} bytes)")
        assert rc[0] == "ok", f"{op} raised {rc[1].__name__}: {rc[2]}"
        assert tc.pending == tp.pending, f"after #{i} {op}: pending c={tc.pending} py={tp.pending}"
        bound = {_FEED: limit + 3, _DRAIN: 3, _FLUSH: 0}[op]
        assert tp.pending <= bound, f"{tp.pending} bytes pending after {op} (max_chunk {limit})"
        for chunk in rc[1]:
            assert type(chunk) is str and chunk, f"empty or non-str chunk {chunk!r}"
            size = len(chunk.encode("utf-8"))  # strict: a chunk never holds a lone surrogate
            assert size <= limit, f"a {size}-byte chunk with max_chunk {limit}"
        segment.append(piece)
        results.append((op, rc[1]))
        drained = drained or op == _DRAIN
        if op == _FLUSH:
            _check_stream(limit, window, b"".join(segment), results, drained)
            segment, results, drained = [], [], False


def _check_stream(
    limit: int, window: int | None, stream: bytes, results: list[tuple[str, list[str]]], drained: bool
) -> None:
    chunks = [chunk for _, out in results for chunk in out]
    assert "".join(chunks) == stream.decode("utf-8", "replace"), "the chunks do not join up to the stream"
    # Only the last chunk a drain or flush returns may be short for no reason; every other one was
    # cut because the next unit (the first character of the next chunk) did not fit.
    effective_window = limit // 8 if window is None else window
    position = 0
    for op, out in results:
        for j, chunk in enumerate(out):
            position += 1
            if op != _FEED and j == len(out) - 1:
                continue
            nxt = chunks[position] if position < len(chunks) else ""
            assert nxt, f"chunk {chunk!r} was cut with nothing after it"
            full = len(chunk.encode()) + len(nxt[0].encode()) > limit
            at_newline = effective_window > 0 and (chunk.endswith("\n") or nxt.startswith("\r\n"))
            assert full or at_newline, f"chunk {chunk!r} cut short before {nxt[:8]!r} (max_chunk {limit})"
    if not drained:
        # Without drain the cuts depend only on the bytes: one read gives the same chunks.
        for module in (c, py):
            one = module.OutputChunker(limit, window)
            assert one.feed(stream) + one.flush() == chunks, f"{module.__name__}: chunks depend on the reads"


if __name__ == "__main__":
    fuzz_main(test_one_input)
