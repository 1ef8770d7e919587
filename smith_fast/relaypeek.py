"""PROVISIONAL (replaced by the twins' facade at merge): request ids in relayed frames."""

from __future__ import annotations

import json

from google.protobuf.message import DecodeError

from .framing import FrameDecoder
from .pb import smith_pb2 as pb

_REQUESTS = {"plan", "tool_call", "hook_load", "shell_exec", "attach", "list_processes"}
_TERMINAL = {pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR}


def command_ids(frame: bytes) -> list[str]:
    try:
        env = pb.Envelope.FromString(frame)
    except DecodeError:
        return []
    kind = env.WhichOneof("payload")
    commands = [env.command] if kind == "command" else list(env.batch_command.commands) if kind == "batch_command" else []
    out = []
    for c in commands:
        k = c.WhichOneof("command_type")
        if k in _REQUESTS:
            rid = getattr(c, k).request_id
            if rid:
                out.append(rid)
    return out


def event_marks(buf: bytes) -> tuple[int, list[str]]:
    last, ended = 0, []
    try:
        frames = FrameDecoder(1 << 30).feed(buf)
    except Exception:
        return last, ended
    for frame in frames:
        try:
            env = pb.Envelope.FromString(frame)
        except DecodeError:
            break
        last = max(last, env.sequence)
        kind = env.WhichOneof("payload")
        evs = [env.event] if kind == "event" else list(env.batch_event.events) if kind == "batch_event" else []
        for ev in evs:
            if ev.WhichOneof("event_type") == "state_change" and ev.state_change.state in _TERMINAL and ev.state_change.request_id:
                ended.append(ev.state_change.request_id)
    return last, ended


def v0_command_ids(line: bytes) -> list[str]:
    try:
        obj = json.loads(line)
        rid = obj.get("data", {}).get("request_id") or obj.get("id")
    except Exception:
        return []
    return [rid] if isinstance(rid, str) and rid and obj.get("type") not in ("Handshake", "Cancel", "Stdin", "Resize", "Shutdown") else []


def v0_event_marks(buf: bytes) -> list[str]:
    out = []
    for line in bytes(buf).split(b"\n"):
        if b'"state' not in line:
            continue
        try:
            obj = json.loads(line)
            data = obj.get("data", {})
            if obj.get("type") == "StateChange" and data.get("state") in ("Ready", "Error", "READY", "ERROR") and data.get("request_id"):
                out.append(data["request_id"])
        except Exception:
            pass
    return out
