"""Write the seed inputs of every target into ``fuzz/corpus/<target>/seed-*``.

Run ``python -m fuzz.make_corpus`` after changing a harness's input layout. Seeds are small, valid
(or deliberately broken) examples of each input layout; the fuzzer starts from them. Files named
``regression-*`` are inputs that once found a bug: this script never touches them.
"""

from __future__ import annotations

import json
import pathlib

from smith_fast import _framing_py as framing
from smith_fast.pb import smith_pb2 as pb

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
RID = "6f1c2a4e-1b2c-4d3e-8f90-0123456789ab"


def _framing_seeds() -> dict[str, bytes]:
    frames = framing.encode_frames([b"", b"a", b"x" * 127, b"y" * 128, b"z" * 300])
    return {
        "frames-whole": bytes([13, 0]) + frames,  # max_frame_size 2**32-1, one feed
        "frames-split": bytes([13, 3, 1, 2, 130]) + frames,
        "frames-bytewise-bytearray": bytes([13, 0x20 | 0x08]) + frames,
        "too-large": bytes([4, 0x10]) + framing.encode_frame(b"q" * 128),  # max_frame_size 127
        "too-long-varint": bytes([13, 1, 4]) + b"\x81" * 11,
        "too-long-varint-at-end": bytes([13, 0]) + b"\xff" * 10,  # ten bytes, nothing after them
        "too-wide": bytes([13, 0x18]) + b"\x80\x80\x80\x80\x10\x00",
        "non-minimal-prefix": bytes([13, 2, 1, 1]) + b"\x83\x80\x80\x00abc",
        "empty-frames-limit-0": bytes([0, 0]) + b"\x00\x00\x00\x01a",
    }


def _chunking_seeds() -> dict[str, bytes]:
    text = "héllo wörld\r\nline two €\n😀😀\n".encode() + b"\xff\xed\xa0\x80\xe2\x82\n\xf0\x9f\x98"
    return {
        "mixed-default-window": bytes([4, 0, 4, 5, 0x80, 20, 0xC1]) + text * 3,
        "crlf-window-max": bytes([5, 2, 2, 0xC4, 0x80]) + b"ab\r\ncd\r\nef\r\n" * 20,
        "no-window-bytearray": bytes([7, 0x81, 0]) + text * 5,
        "invalid-only": bytes([0, 3, 3, 1, 1, 1]) + b"\xed\xa0\x80\xf4\x90\x80\x80\xc0\xaf\xe0\x80",
        "large-chunk": bytes([12, 0, 1, 0xFE]) + text * 40,
    }


def _jsonl_lines() -> list[object]:
    return [
        {"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec", "replay", "bogus"]}},
        {"type": "ShellExec", "data": {"request_id": RID, "command": "echo hi", "shell": None, "cwd": None,
                                       "env": {"A": "b"}, "timeout_ms": 5000}},
        {"type": "ToolCall", "data": {"request_id": RID.upper(), "tool": "fs.read",
                                      "args": {"path": "a", "n": [1, 2.5e-7, 1e300, 123456789012345678901]},
                                      "timeout_ms": None}},
        {"type": "HookLoad", "data": {"request_id": "{" + RID + "}", "hook_type": "js", "script": "x"}},
        {"type": "Plan", "data": {"request_id": "urn:uuid:" + RID, "goal": "g", "context": {}}},
        {"type": "Shutdown"},
        {"type": "Ready", "data": {"version": 0, "capabilities": ["shell_exec", "x"], "service_id": RID}},
        {"type": "StateChange", "data": {"request_id": RID.replace("-", ""), "state": "Processing", "timestamp": 1}},
        {"type": "Log", "data": {"level": "Warn", "message": "m", "timestamp": 2, "request_id": None}},
        {"type": "TokenUsage", "data": {"request_id": RID, "tokens_used": 5, "tokens_remaining": None}},
        {"type": "ShellOutput", "data": {"request_id": RID, "stdout": "a\n", "stderr": None, "exit_code": -1,
                                         "finished": True}},
        {"type": "ToolResult", "data": {"request_id": RID, "success": True, "result": {"x": [1e-5, None]},
                                        "error": None}},
        {"type": "HookResult", "data": {"request_id": RID, "action": {"type": "Block", "data": {"reason": "r"}}}},
        {"type": "HookResult", "data": {"request_id": RID, "action": {"type": "Transform", "data": [1]}}},
        {"type": "GraphDelta", "data": {"request_id": None,
                                        "nodes_added": [{"id": RID, "label": "l", "node_type": "t", "metadata": {}}],
                                        "edges_added": [{"id": RID, "from": RID, "to": RID, "label": None,
                                                         "edge_type": "e"}],
                                        "nodes_removed": [RID], "edges_removed": []}},
        {"type": "Error", "data": {"request_id": None, "error_code": "NOT_A_CODE", "message": "m", "timestamp": 3}},
        {"type": "Error", "data": {"request_id": RID, "error_code": "EXECUTION_TIMEOUT", "message": "t",
                                   "timestamp": 3}},
    ]  # fmt: skip


def _jsonl_seeds() -> dict[str, bytes]:
    seeds = {}
    for i, obj in enumerate(_jsonl_lines()):
        name = obj["type"].lower() if isinstance(obj, dict) else "line"  # type: ignore[index]
        seeds[f"{i:02d}-{name}"] = json.dumps(obj, ensure_ascii=False).encode() + b"\n"
    seeds["crlf-blank-and-tail"] = b'\r\n  \t\n{"type":"Shutdown"}\r\n{"type":"Handshake","data":{"version":1'
    seeds["deep-nesting"] = b'{"type":"ToolCall","data":{"args":' + b"[" * 130 + b"]" * 130 + b"}}\n"
    seeds["surrogates-and-numbers"] = (
        b'{"type":"Log","data":{"level":"Info","message":"\\ud800","timestamp":1e400,"request_id":null}}\n'
        b'{"type":"Log","data":{"level":"Info","message":"\\ud83d\\ude00","timestamp":18446744073709551616,'
        b'"request_id":null}}\n{"type":NaN}\n\xff\xfe\n'
    )
    return seeds


def _envelope_seeds() -> dict[str, bytes]:
    envs = []
    e = pb.Envelope(timestamp=1, sequence=1)
    e.command.handshake.version = 1
    e.command.handshake.capabilities.extend([1, 5, 77])
    e.command.handshake.client_info["sdk"] = "seed"
    envs.append(e)
    e = pb.Envelope(sequence=2)
    s = e.command.shell_exec
    s.request_id, s.command, s.cwd, s.timeout_ms = RID, "echo hi", "/", 500
    s.env["A"] = "b"
    envs.append(e)
    e = pb.Envelope(sequence=3)
    t = e.command.tool_call
    t.request_id, t.tool, t.args = RID, "fs.read", b'{"path":"a.txt","limit":[1,2.5,null]}'
    envs.append(e)
    e = pb.Envelope(sequence=4)
    t = e.command.tool_call
    t.request_id, t.tool, t.args = "not-a-uuid", "tools.list", b"\xffnot json"
    envs.append(e)
    e = pb.Envelope(sequence=5)
    b = e.batch_command
    b.require_ordering = True
    b.commands.add().plan.request_id = RID
    b.commands.add().hook_load.hook_type = "js"
    envs.append(e)
    e = pb.Envelope(sequence=6)
    e.event.error.error_code = pb.ERROR_CODE_INTERNAL_ERROR
    e.event.error.details["v0_error_code"] = "X"
    envs.append(e)
    e = pb.Envelope(sequence=7)
    e.health_check_request.service_name = "smith"
    envs.append(e)
    e = pb.Envelope(sequence=8)
    e.command.shutdown.SetInParent()
    envs.append(e)
    stream = framing.encode_frames([x.SerializeToString() for x in envs])
    return {
        "session-whole": bytes([5, 0]) + stream,
        "session-split-7": bytes([5, 7]) + stream,
        "garbage-frames": bytes([5, 3]) + framing.encode_frames([b"\xff\xff", b"\x52\x05\x0a", b"\x08" * 9]),
        "too-large": bytes([2, 0]) + framing.encode_frame(b"\x00" * 40),
    }


def _events_seeds() -> dict[str, bytes]:
    # FuzzedDataProvider input: any bytes make valid arguments; a few patterns to start from.
    return {f"pattern-{i}": bytes((i * 37 + k * 11) % 256 for k in range(64 + 32 * i)) for i in range(6)}


def _plan_seeds() -> dict[str, bytes]:
    steps = [{"id": "build", "kind": "shell", "command": "make"},
             {"id": "test", "kind": "shell", "command": "make test", "depends_on": ["build"]},
             {"id": "read", "kind": "tool", "tool": "fs.read", "args": {"path": "a"}, "after": ["test"]}]
    return {
        "shell-lists": b"\x00cd src && make -j2; echo done\nif true; then ls | wc -l; fi || echo no",
        "shell-expansions": b"\x00echo \"$(date +%s) ${HOME:-/} `id -u`\" $((1+2)) <<EOF\nbody\nEOF\necho after",
        "shell-comments-quotes": b"\x00# a comment\necho 'a && b' \"c ; d\" \\\n  e # tail\ncase x in x) echo;; esac",
        "steps-json": b"\x01" + json.dumps(steps).encode(),
        "context-note": b"\x02Write the release notes\x00goal_kind=note\nexecute=false",
        "context-steps": b"\x02g\x00steps=" + json.dumps(steps[:1]).encode() + b"\nexecute=true",
    }


def _v0fields_seeds() -> dict[str, bytes]:
    sep = b"\xfe"
    return {
        "plain": sep.join([b"echo hi", b"", b"sub", b"A", b"b", b"fs.read", b"a.txt", b"make && make test"]),
        "shell-and-cwd": sep.join([b"ls -la", b"/bin/bash", b"/tmp", b"LANG", b"C", b"fs.list", b".", b""]),
        "outside-and-refused": sep.join([b"true", b"", b"../../etc", b"LD_PRELOAD", b"x.so", b"fs.read", b"/etc/passwd", b"${x"]),
        "odd-bytes": sep.join([b"echo \xc3\xa9 \xff", b"", b"\xed\xa0\x80", b"\xe2\x82\xac", b"v", b"x", b"\xff", b"\"$("]),
    }


SEEDS = {
    "framing": _framing_seeds,
    "chunking": _chunking_seeds,
    "jsonl": _jsonl_seeds,
    "envelope": _envelope_seeds,
    "events": _events_seeds,
    "plan": _plan_seeds,
    "v0fields": _v0fields_seeds,
}


def main() -> None:
    for target, make in SEEDS.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for name, data in make().items():
            (folder / f"seed-{name}").write_bytes(data)


if __name__ == "__main__":
    main()
