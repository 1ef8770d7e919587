"""The audit trail: one structured log line per request, at ``info``, on stderr.

Each line (logger ``smith_fast.audit``, event ``request``) carries: ``session``, ``peer``,
``kind`` (``shell_exec``, ``tool_call``, ``hook_load``, ``plan``, ``plan_step``), ``request_id``,
``parent`` (a plan step's plan), ``command`` or ``tool`` (cut to :data:`MAX_SUBJECT` characters),
``origin`` (which way a process was started: ``shell_exec``, ``plan_step``, a tool's name),
``hooks`` (the decisions: trigger, action, hook id, reason; output-chunk allows are not listed),
``outcome`` (``ok``, ``blocked``, ``refused``, ``error``, ``timeout``, ``cancelled``), ``error_code``
and ``reason`` when it did not end well, ``exit_code`` of its process, ``killed`` with
``kill_reason`` when the service stopped it, and ``duration_ms``.

A hook block is ``outcome: "blocked"`` naming the hook, not a protocol error. A request the session
refused before it ran (a capability not granted, too large, too many in flight) gets its line too,
``outcome: "refused"`` with the error (:func:`refused`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError
from json.encoder import encode_basestring as _json_string  # the C one

from ..logs import direct_handlers, encode_json as _encode_json, get_logger, log_fields
from ..pb import smith_pb2 as pb

__all__ = ["Audit", "AuditRecord", "MAX_SUBJECT", "MAX_DECISIONS", "refused"]

log = get_logger("smith_fast.audit")

MAX_SUBJECT = 256
"""A command or tool name longer than this many characters is cut in the audit line."""
MAX_DECISIONS = 32
"""Hook decisions listed per request; more are counted in ``hooks_omitted``."""
_MAX_REASON = 256

# ProtocolError details["reason"] → outcome; anything else is "error"
_OUTCOMES = {
    "hook_blocked": "blocked",
    "env_refused": "refused",
    "cancelled": "cancelled",
}


_TOOL_FIELDS: dict[str, str] = {}
"""A tool's name -> its ``,"tool":...`` text in :meth:`Audit.tool_ended`'s lines. Only a registered
tool's call ends in one step (an unknown name never gets there), so it holds at most a name per tool."""
# The ends of tool_ended's line after the tool name; the duration and the closing brace follow.
_SUCCEEDED = ',"success":true,"outcome":"ok","hooks":[],"duration_ms":'
_FAILED = ',"success":false,"outcome":"ok","hooks":[],"duration_ms":'


def _line_head(session: str, peer: str) -> str:
    """What follows ``"ts"`` in a session's tool_ended lines up to the request id's value, as
    :func:`~smith_fast.logs.log_fields` encodes it (its keys in the same order)."""
    whole = _encode_json({"level": "info", "logger": log.name, "event": "request", "session": session, "peer": peer,
                          "kind": "tool_call", "request_id": ""})
    return whole[1:-3]  # without the braces and the empty request id's quotes


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class AuditRecord:
    """The audit line of one request (or plan step) while it runs; :meth:`end` writes it."""

    __slots__ = ("fields", "started", "decisions", "omitted")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.started = time.monotonic()
        self.decisions: list[dict[str, str]] = []
        self.omitted = 0

    def note(self, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            self.fields[key] = _clip(value, MAX_SUBJECT) if isinstance(value, str) and key in ("command", "tool", "origin") else value

    def decision(self, trigger: str, action: str, hook_id: str | None, reason: str | None) -> None:
        if len(self.decisions) >= MAX_DECISIONS:
            self.omitted += 1
            return
        entry = {"trigger": trigger, "action": action}
        if hook_id:
            entry["hook_id"] = hook_id
        if reason:
            entry["reason"] = _clip(reason, _MAX_REASON)
        self.decisions.append(entry)

    def end(self, error: BaseException | None = None) -> None:
        """Its request reached its terminal state: write the line."""
        fields = self.fields
        if error is None:
            fields["outcome"] = "ok"
        elif isinstance(error, ProtocolError):
            reason = error.details.get("reason", "")
            outcome = _OUTCOMES.get(reason) or ("timeout" if error.code == pb.ERROR_CODE_EXECUTION_TIMEOUT else "error")
            fields["outcome"] = outcome
            fields["error_code"] = pb.ErrorCode.Name(error.code).removeprefix("ERROR_CODE_")
            fields["reason"] = _clip(str(error), _MAX_REASON)
            if reason == "hook_blocked":
                fields["blocked_by"] = error.details.get("hook_id", "")
        else:
            fields["outcome"] = "cancelled" if isinstance(error, asyncio.CancelledError) else "error"
            fields["reason"] = _clip(f"{type(error).__name__}: {error}", _MAX_REASON)
        fields["hooks"] = self.decisions
        if self.omitted:
            fields["hooks_omitted"] = self.omitted
        fields["duration_ms"] = int((time.monotonic() - self.started) * 1000)
        log_fields(log, logging.INFO, "request", fields, linger=True)

    def cancelled(self) -> None:
        """The session ended before its request did."""
        self.fields["outcome"] = "cancelled"
        self.fields["hooks"] = self.decisions
        self.fields["duration_ms"] = int((time.monotonic() - self.started) * 1000)
        log.info("request", extra={"fields": self.fields})


class Audit:
    """The audit lines of one session's requests.

    A request's record is the request's own (:attr:`Request.audit
    <smith_fast.service.request.Request.audit>`, found through ``find``); a plan step's, which is
    no request of the session, is kept here while the step runs.

    Args:
        session: the session id.
        peer: the peer's address.
        find: the open record of running request ``rid``, if any.
    """

    __slots__ = ("_session", "_peer", "_find", "_steps", "workspace", "_head", "_ms", "_ts")

    def __init__(self, session: str, peer: str, find: Callable[[str], AuditRecord | None] = lambda _rid: None) -> None:
        self._session = session
        self._peer = peer
        self._find = find
        self._steps: dict[str, AuditRecord] = {}
        self.workspace = ""  # the session's workspace id (serve --workspaces), in every line once set
        self._head: str | None = None  # tool_ended's constant part, encoded on first use
        self._ms = 0  # the millisecond of _ts: the calls of one millisecond share its text
        self._ts = ""

    def open(self, rid: str, kind: str, *, parent: str | None = None) -> AuditRecord:
        """The record of a request (or a plan step) that starts."""
        fields: dict[str, Any] = {"session": self._session, "peer": self._peer, "kind": kind, "request_id": rid}
        if self.workspace:
            fields["workspace"] = self.workspace
        if parent is not None:
            fields["parent"] = parent
        return AuditRecord(fields)

    def begin(self, rid: str, kind: str, *, parent: str | None = None) -> None:
        """A plan step starts (a request's record is opened by its runner, :meth:`open`)."""
        self._steps[rid] = self.open(rid, kind, parent=parent)

    def _record(self, rid: str) -> AuditRecord | None:
        return self._steps.get(rid) if self._steps and rid in self._steps else self._find(rid)

    def tool_ended(self, rid: str, tool: str, success: bool, duration_ms: int) -> None:
        """The line of a tool call that began and ended in one step, ``duration_ms`` long: what
        :meth:`open`, :meth:`note` of ``tool`` and ``success`` and the end write, in one go.

        Where only the service's own JSON-line handler listens, the line is put together from the
        session's constant part (encoded once) and the call's own values: the same text
        :func:`~smith_fast.logs.log_fields` writes for the same fields, at a fraction of its cost
        (it was a third of the server's CPU per small pipelined ``fs.read``)."""
        if not log.isEnabledFor(logging.INFO):
            return
        handlers = direct_handlers(log, logging.INFO)
        if handlers is None or not (rid.isascii() and tool.isascii()):  # non-ASCII: the encoders' own rules
            fields: dict[str, Any] = {
                "session": self._session, "peer": self._peer, "kind": "tool_call", "request_id": rid,
                "tool": _clip(tool, MAX_SUBJECT), "success": success, "outcome": "ok", "hooks": [],
                "duration_ms": duration_ms,
            }
            if self.workspace:
                fields["workspace"] = self.workspace
            log_fields(log, logging.INFO, "request", fields, linger=True)
            return
        head = self._head
        if head is None:
            head = self._head = _line_head(self._session, self._peer)
        tail = _SUCCEEDED if success else _FAILED
        if self.workspace:
            tail = f'{tail}{duration_ms},"workspace":{_encode_json((self.workspace,))[1:-1]}}}\n'
        else:
            tail = f"{tail}{duration_ms}}}\n"
        now = time.time()
        if (ms := round(now * 1000)) != self._ms:  # formatting a float costs more than the rest of the line
            self._ms, self._ts = ms, repr(round(now, 3))
        tool_field = _TOOL_FIELDS.get(tool)
        if tool_field is None:
            tool_field = _TOOL_FIELDS[tool] = f',"tool":{_json_string(_clip(tool, MAX_SUBJECT))}'
        line = f'{{"ts":{self._ts},{head}{_json_string(rid)}{tool_field}{tail}'
        for handler in handlers:
            handler.add_line(line, linger=True)

    def note(self, rid: str, **fields: Any) -> None:
        """Add fields to ``rid``'s line (``command``, ``tool`` and ``origin`` are cut)."""
        record = self._record(rid)
        if record is not None:
            record.note(fields)

    def decision(self, rid: str, trigger: str, action: str, hook_id: str | None, reason: str | None) -> None:
        """A hook decided something about ``rid``."""
        record = self._record(rid)
        if record is not None:
            record.decision(trigger, action, hook_id, reason)

    def process(self, rid: str, exit_code: int | None, *, killed: str | None = None) -> None:
        """``rid``'s process ended with ``exit_code``; ``killed`` says why the service stopped it."""
        record = self._record(rid)
        if record is None:
            return
        record.fields["exit_code"] = exit_code
        if killed is not None:
            record.fields["killed"] = True
            record.fields["kill_reason"] = killed

    def end(self, rid: str, error: BaseException | None = None) -> None:
        """Plan step ``rid`` ended: write its line."""
        record = self._steps.pop(rid, None)
        if record is not None:
            record.end(error)

    def close(self) -> None:
        """The session is over: plan steps still open end as cancelled (its requests' records end
        with their requests)."""
        steps, self._steps = self._steps, {}
        for record in steps.values():
            record.cancelled()


def refused(session: str, peer: str, error: ProtocolError) -> None:
    """The audit line of a request refused before it ran (it never reached a runner)."""
    log.info(
        "request",
        extra={"fields": {
            "session": session, "peer": peer, "request_id": error.request_id, "outcome": "refused",
            "error_code": pb.ErrorCode.Name(error.code).removeprefix("ERROR_CODE_"), "reason": _clip(str(error), _MAX_REASON),
            "hooks": [], "duration_ms": 0,
        }},
    )
