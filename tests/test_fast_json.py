"""The hot paths' orjson shortcuts give exactly what the stdlib json paths gave: the same result
bytes, the same argument values and errors, the same log lines."""

from __future__ import annotations

import io
import json
import logging
import sys
from typing import Any

import pytest

from smith_fast import logs
from smith_fast.tools.registry import encode_result
from smith_fast.tools.schema import ArgumentError, decode_args

_STDLIB_RESULT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_EVERY_CHAR = "".join(chr(c) for c in range(0x30000) if not 0xD800 <= c < 0xE000)


@pytest.mark.parametrize("value", [
    {"path": _EVERY_CHAR, "size": 72, "offset": 0, "truncated": False, "none": None},
    {"big": 2**64 - 1, "small": -(2**63), "huge": 2**70, 'k"\\\n': "v"},
    {"nested": {"a": [1, 2]}, "f": 1e16},  # not flat: json writes it
    [1, "two"],
])
def test_result_bytes_are_json_compact_bytes(value: Any) -> None:
    assert encode_result(value) == _STDLIB_RESULT.encode(value).encode()


@pytest.mark.parametrize(("value", "error"), [
    ({"a": "\ud800"}, UnicodeEncodeError), ({"a": float("nan")}, ValueError), ({"a": float("inf")}, ValueError),
])
def test_results_json_refuses_are_still_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_result(value)


@pytest.mark.parametrize("raw", [
    b'{"path":"a.txt","offset":3}', b'{"a":1,"a":2}', b"[1e400]", b'{"n":123456789012345678901234567890}',
    b'"\\ud800"', b' {"x": [true, false, null]} ',
])
def test_arguments_decode_to_what_json_decodes(raw: bytes) -> None:
    assert decode_args(raw) == json.loads(raw)


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"a":NaN}', "NaN is not a JSON value"), (b"\xff", "invalid UTF-8 at byte 0"), (b"\xef\xbb\xbf{}", "BOM"),
    (b"{", "invalid JSON"), (b"[" * 100_000, "nested too deeply"),
])
def test_bad_arguments_get_json_s_messages(raw: bytes, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        decode_args(raw)


def test_log_fields_writes_the_line_logging_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    root = logging.getLogger("smith_fast")
    saved = root.handlers[:], root.level, root.propagate
    try:
        logs.configure("info")
        log = logs.get_logger("smith_fast.audit")
        fields = {"session": "s", "request_id": "r1", "hooks": [], "tool": "fs.read é", "n": 2**70}
        logs.log_fields(log, logging.INFO, "request", fields)
        log.info("request", extra={"fields": fields})
        logs.log_fields(log, logging.DEBUG, "request", fields)  # below the level: nothing
        for handler in root.handlers:
            handler.flush()
    finally:
        root.handlers[:], root.level, root.propagate = saved
    direct, through_logging = [json.loads(line) for line in out.getvalue().splitlines()]
    assert abs(direct.pop("ts") - through_logging.pop("ts")) < 1
    assert direct == through_logging == {"level": "info", "logger": "smith_fast.audit", "event": "request", **fields}


@pytest.mark.parametrize(("rid", "tool", "success", "workspace"), [
    ("r1", "fs.read", True, ""), ('r"2\n\\', "fs.read", False, ""), ("r3é", "fs.réad", True, ""),
    ("r4", "x" * 300, True, "ws-1"), ("\ud800", "fs.read", True, ""),
])
def test_a_one_step_tool_calls_audit_line_is_the_line_log_fields_writes(
    monkeypatch: pytest.MonkeyPatch, rid: str, tool: str, success: bool, workspace: str
) -> None:
    from smith_fast.service.audit import MAX_SUBJECT, Audit

    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    root = logging.getLogger("smith_fast")
    saved = root.handlers[:], root.level, root.propagate
    peer = 'unix:/p é"q'
    try:
        logs.configure("info")
        audit = Audit("s", peer)
        audit.workspace = workspace
        audit.tool_ended(rid, tool, success, 7)
        fields = {"session": "s", "peer": peer, "kind": "tool_call", "request_id": rid,
                  "tool": tool if len(tool) <= MAX_SUBJECT else tool[: MAX_SUBJECT - 3] + "...", "success": success,
                  "outcome": "ok", "hooks": [], "duration_ms": 7}
        if workspace:
            fields["workspace"] = workspace
        logs.log_fields(logs.get_logger("smith_fast.audit"), logging.INFO, "request", fields)
        for handler in root.handlers:
            handler.flush()
    finally:
        root.handlers[:], root.level, root.propagate = saved
    direct, reference = out.getvalue().splitlines()
    assert direct.split(",", 1)[1] == reference.split(",", 1)[1]  # all but the time stamp, byte for byte
    assert json.loads(direct)["request_id"] == rid
