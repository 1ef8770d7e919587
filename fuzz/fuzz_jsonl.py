"""Fuzz the v0 path: ``LineDecoder`` → ``JsonlCodec.decode_command``/``decode_event`` → encoders.

The input is a v0 byte stream as a peer would send it (the corpus files are plain JSON lines). The
"twins" of the v0 codec are its two JSON backends, stdlib ``json`` and ``orjson``, which promise to
accept the same lines and write the same bytes (``smith_fast/jsonl/__init__.py``).

Checked on every input:

* ``LineDecoder``, fed in pseudo-random pieces, with a large and a tiny ``max_line_size``: the
  lines (returned, or on the error of a failing feed) are those of a plain split of the stream,
  minus blank and oversize lines; an error is raised iff a line is oversize, and points at one;
  the decoder never holds more than ``max_line_size`` bytes.
* every line (the unterminated tail too) through ``decode_command`` and ``decode_event`` with both
  backends: the same message, or the same ``ProtocolError`` (code, details, request_id, the decoded
  message it carries; the wording too, except of the parser's own ``invalid_json`` text). Nothing
  else is ever raised.
* what decodes, encodes (``encode_command``/``encode_event``) to the same bytes with both backends,
  and decodes back to the same message; the direct event encoders (``state_change``, ``log`` ...)
  write the same bytes as ``encode_event``.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from fuzz._common import fuzz_main, instrumented, outcome

with instrumented(__name__):
    from smith_fast.errors import EncodeError, FrameTooLarge, ProtocolError
    from smith_fast.jsonl import JsonlCodec, LineDecoder
    from smith_fast.pb import smith_pb2 as pb

CODECS = (JsonlCodec("json"), JsonlCodec("orjson"))
LINE_LIMITS = (1 << 16, 7)
MAX_LINES = 64  # per input: the codec checks are what cost
_BLANK = b" \t\r"
_ERR_ATTRS = ("code", "details", "request_id", "command", "event")


def expected_lines(stream: bytes, limit: int) -> tuple[list[bytes], list[tuple[int, int]]]:
    """What ``LineDecoder(limit)`` must return for ``stream``, and ``(offset, size)`` of oversize lines."""
    kept: list[bytes] = []
    oversize: list[tuple[int, int]] = []
    offset = 0
    parts = stream.split(b"\n")
    for i, part in enumerate(parts):
        complete = i < len(parts) - 1
        if len(part) > limit:
            oversize.append((offset, len(part)))
        elif complete:
            line = part[:-1] if part.endswith(b"\r") else part
            if line.strip(_BLANK):
                kept.append(line)
        offset += len(part) + 1
    return kept, oversize


def check_line_decoder(stream: bytes, limit: int, rng: random.Random) -> list[bytes]:
    dec = LineDecoder(limit)
    assert dec.max_line_size == limit
    got: list[bytes] = []
    errors: list[Any] = []
    pos = 0
    while pos < len(stream):
        step = rng.choice((1, 2, 3, 7, 64, 4096))
        piece = stream[pos : pos + step]
        pos += step
        if step == 3:
            buffered = dec.buffered
            try:
                dec.feed(7)  # type: ignore[arg-type]  # an int used to be read as seven NUL bytes
            except TypeError:
                pass
            else:
                raise AssertionError("LineDecoder.feed(7) must raise TypeError")
            assert dec.buffered == buffered
        if step & 1:
            wrapped: Any = piece
        elif step == 2:
            wrapped = bytearray(piece)
        else:  # a strided view, as bytes-like as any: the decoder must read it in logical order
            wrapped = memoryview(bytes(b for pair in zip(piece, piece) for b in pair))[::2]
        try:
            lines = dec.feed(wrapped)
        except FrameTooLarge as exc:
            assert 0 <= exc.index <= len(exc.frames)  # type: ignore[attr-defined]
            lines = exc.frames  # type: ignore[attr-defined]
            errors.append(exc)
        assert all(type(line) is bytes for line in lines)
        got += lines
        assert dec.buffered <= limit, f"{dec.buffered} bytes buffered with max_line_size {limit}"
    want, oversize = expected_lines(stream, limit)
    assert got == want, f"max_line_size {limit}: lines {got[:5]!r} ... expected {want[:5]!r} ..."
    assert bool(errors) == bool(oversize) and len(errors) <= len(oversize), (errors, oversize)
    starts = {offset: size for offset, size in oversize}
    for exc in errors:
        assert exc.offset in starts and limit < exc.size <= starts[exc.offset] and exc.limit == limit, (
            exc,
            oversize,
        )
    return got


def _same_decoding(results: list[Any], what: str, line: bytes) -> None:
    a, b = results
    if a[0] == "ok" or b[0] == "ok":
        assert a == b, f"{what} {line[:200]!r}: backends disagree\n  json:   {a!r:.800}\n  orjson: {b!r:.800}"
        return
    for r in results:
        assert r[1] is ProtocolError, f"{what} {line[:200]!r} raised {r[1].__name__}: {r[2]}"
    assert a[3] == b[3], f"{what} {line[:200]!r}: errors differ\n  json:   {a!r:.800}\n  orjson: {b!r:.800}"
    if a[3]["details"].get("reason") != "invalid_json":  # the parsers word their own errors
        assert a[2] == b[2], f"{what} {line[:200]!r}: messages differ\n  json:   {a[2]}\n  orjson: {b[2]}"


def _encoded(method: str, message: Any) -> bytes | None:
    """Encode with both backends: the same bytes (returned) or the same ``EncodeError`` (None)."""
    results = [outcome(getattr(codec, method), message) for codec in CODECS]
    assert results[0] == results[1], f"{method}: backends disagree on {message!r:.500}: {results!r:.800}"
    if results[0][0] == "err":
        assert results[0][1] is EncodeError, f"{method} raised {results[0][1].__name__}: {results[0][2]}"
        return None
    line = results[0][1]
    assert line.endswith(b"\n") and line.count(b"\n") == 1, line
    return line


def _round_trip(kind: str, message: Any) -> None:
    line = _encoded(f"encode_{kind}", message)
    if line is None:
        return
    for codec in CODECS:
        again = outcome(getattr(codec, f"decode_{kind}"), line, attrs=_ERR_ATTRS)
        if again[0] == "err" and again[1] is ProtocolError:
            again = ("ok", again[3][kind])  # unknown capabilities: the decoded message is carried
        assert again == ("ok", message), f"{kind} {message!r:.500} -> {line!r:.500} -> {again!r:.500}"


def _direct_encoders(event: Any) -> None:
    """The hot-event encoders must write what ``encode_event`` writes."""
    line = _encoded("encode_event", event)
    kind = event.WhichOneof("event_type")
    for codec in CODECS:
        if kind == "state_change":
            m = event.state_change
            direct = codec.state_change(m.state, m.request_id if m.HasField("request_id") else None, m.timestamp)
        elif kind == "shell_output":
            m = event.shell_output
            direct = codec.shell_output(
                m.request_id,
                m.stdout if m.HasField("stdout") else None,
                m.stderr if m.HasField("stderr") else None,
                m.exit_code if m.HasField("exit_code") else None,
                m.finished,
            )
        elif kind == "tool_result":
            m = event.tool_result
            direct = codec.tool_result(m.request_id, m.success, m.result, m.error if m.HasField("error") else None)
        elif kind == "log":
            m = event.log
            direct = codec.log(m.level, m.message, m.timestamp, m.request_id if m.HasField("request_id") else None)
        elif kind == "error" and "v0_error_code" not in event.error.details:
            m = event.error
            direct = codec.error(m.error_code, m.message, m.request_id if m.HasField("request_id") else None,
                                 m.timestamp)  # fmt: skip
        else:
            return
        assert direct == line, f"{codec.backend}.{kind}: {direct!r:.500} != encode_event {line!r:.500}"


def check_line(line: bytes) -> None:
    for kind in ("command", "event"):
        results = [outcome(getattr(codec, f"decode_{kind}"), line, attrs=_ERR_ATTRS) for codec in CODECS]
        _same_decoding(results, f"decode_{kind}", line)
        result = results[0]
        if result[0] == "ok":
            message = result[1]
        elif result[3]["code"] == pb.ERROR_CODE_INVALID_CAPABILITY:
            message = result[3][kind]
            assert message is not None, "an unknown-capability error must carry the decoded message"
        else:
            continue
        _round_trip(kind, message)
        if kind == "event":
            _direct_encoders(message)


def test_one_input(data: bytes) -> None:
    rng = random.Random(zlib.crc32(data))
    lines = check_line_decoder(data, LINE_LIMITS[0], rng)
    check_line_decoder(data, LINE_LIMITS[1], rng)
    tail = data.rsplit(b"\n", 1)[-1]
    if tail.strip(_BLANK) and len(tail) <= LINE_LIMITS[0]:
        lines.append(tail)  # what a peer would send next: decode it too
    for line in lines[:MAX_LINES]:
        check_line(line)


if __name__ == "__main__":
    fuzz_main(test_one_input, dictionary="jsonl.dict")
