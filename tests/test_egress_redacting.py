"""Secret values replaced in streams that arrive in pieces: StreamRedactor (a command's output) and
ResponseRedactor (a plain-HTTP response of a host that got secrets), at every split point.

The end-to-end paths (a real serve, real curl, a server that echoes the value split across chunks)
are in test_egress_sandbox.py; these hold the byte logic to every boundary.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast.egress.http_response import ResponseRedactor
from smith_fast.egress.redacting import StreamRedactor

VALUE = b"real-4f1e9c0d7a"
OTHER = b"rr-r"   # a value that starts like itself again: the held end must be the earliest start
PAIRS = ((VALUE, b"[secret A]"), (OTHER, b"[secret B]"))


def _streamed(data: bytes, cuts: list[int], pairs: tuple[tuple[bytes, bytes], ...] = PAIRS) -> bytes:
    redactor = StreamRedactor(pairs)
    out, at = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out.append(redactor.feed(data[at:cut]))
        at = cut
    out.append(redactor.end())
    return b"".join(out)


def _whole(data: bytes) -> bytes:
    for find, replacement in sorted(PAIRS, key=lambda p: -len(p[0])):
        data = data.replace(find, replacement)
    return data


def test_a_value_split_at_every_point_is_replaced() -> None:
    data = b"token=" + VALUE + b" and again:" + VALUE
    for cut in range(len(data) + 1):
        for second in range(cut, len(data) + 1):
            assert _streamed(data, [cut, second]) == b"token=[secret A] and again:[secret A]", (cut, second)


def test_only_a_possible_start_is_held_back() -> None:
    redactor = StreamRedactor(PAIRS)
    assert redactor.feed(b"a prompt> ") == b"a prompt> "   # nothing like a value's start: at once
    assert redactor.feed(b"partly real-4f") == b"partly "
    assert redactor.feed(b"1e") == b""
    assert redactor.feed(b"X") == b"real-4f1eX"              # it was not the value after all
    assert redactor.feed(b"rr-") == b""
    assert redactor.end() == b"rr-"                          # the stream's end gives out what is held


def test_no_pairs_pass_everything() -> None:
    redactor = StreamRedactor(())
    assert redactor.feed(b"anything") == b"anything" and redactor.end() == b""


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([VALUE, OTHER, b"r", b"real-", b"x", b"rr", b"-4f1e9c0d7a", b"\n"]), max_size=20),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_streamed_equals_whole(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    got = _streamed(data, [c for c in cuts if c <= len(data)])
    assert got == _whole(data)
    assert VALUE not in got


def _response(raw: bytes, cuts: list[int]) -> bytes:
    redactor = ResponseRedactor(((VALUE, b"PLACEHOLDER"),), 65536)
    out, at = [], 0
    for cut in sorted(set(cuts)) + [len(raw)]:
        got = redactor.feed(raw[at:cut])
        assert got is not None
        out.append(got)
        at = cut
    if not redactor.done:
        out.append(redactor.end())
    return b"".join(out)


class _Parsed:
    """A response whose body ends with the connection (what the redactor makes of one with a body)."""

    def __init__(self, data: bytes) -> None:
        head, _, self.body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        self.status = int(status_line.split(b" ")[1])
        self.headers = {name.lower(): value for name, _, value in (line.partition(b": ") for line in lines)}


_CHUNKED = (b"HTTP/1.1 200 OK\r\nX-Echo: Bearer " + VALUE + b"\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
            + b"9\r\nBearer re\r\n" + b"%x\r\n" % (len(VALUE) - 2 + 5) + VALUE[2:] + b" and \r\n"
            + b"%x\r\n" % len(VALUE) + VALUE + b"\r\n0\r\n\r\n")
_LENGTH = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(VALUE) * 2 + 1)) + VALUE + b"," + VALUE


def test_a_chunked_response_split_anywhere() -> None:
    for cut in range(0, len(_CHUNKED), 3):
        out = _response(_CHUNKED, [cut, cut + 7])
        assert VALUE not in out, cut
        parsed = _Parsed(out)
        assert parsed.status == 200
        assert parsed.headers[b"x-echo"] == b"Bearer PLACEHOLDER" and parsed.headers[b"connection"] == b"close"
        assert b"transfer-encoding" not in parsed.headers and b"content-length" not in parsed.headers
        assert parsed.body == b"Bearer PLACEHOLDER and PLACEHOLDER", cut


def test_a_response_with_a_length_and_an_interim_head() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + _LENGTH
    for cut in range(len(raw)):
        out = _response(raw, [cut])
        assert VALUE not in out and out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
        assert _Parsed(out.split(b"\r\n\r\n", 1)[1]).body == b"PLACEHOLDER,PLACEHOLDER"


def test_bodiless_responses_keep_no_body() -> None:
    out = _response(b"HTTP/1.1 304 Not Modified\r\nETag: " + VALUE + b"\r\n\r\n", [])
    assert out == b"HTTP/1.1 304 Not Modified\r\nETag: PLACEHOLDER\r\nConnection: close\r\n\r\n"


def test_no_http_and_an_oversized_head_are_refused() -> None:
    assert ResponseRedactor(((VALUE, b"P"),), 65536).feed(b"SSH-2.0-OpenSSH\r\n\r\n") is None
    big = b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 2000 + b"\r\n"
    assert ResponseRedactor(((VALUE, b"P"),), 1024).feed(big + b"\r\n") is None
