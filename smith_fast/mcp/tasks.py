"""The tasks extension (``io.modelcontextprotocol/tasks``, MCP 2026-07-28) for ``shell`` calls.

A ``shell`` call of a client that declared the extension in its request's capabilities and that
has not ended after :data:`TASK_AFTER` seconds is answered with a task handle (``resultType:
"task"``); the command goes on. ``tasks/get`` tells its state (``working``, ``input_required``
while the command waits for input, then ``completed`` with the ``CallToolResult``, or
``cancelled``) and, ours, the output since the cursor the client gives in ``_meta`` (a byte count
over stdout and stderr together), so a client can follow a long command without waiting for its
end. ``tasks/update`` answers the input request (the line goes to the command's stdin);
``tasks/cancel`` stops it.

A task outlives the request that made it, so tasks live in a :class:`TaskTable` of the endpoint
that runs them (stdio: the connection's; HTTP: the one endpoint of stateless requests), for
:data:`TASK_TTL_MS` after they were made; a finished one that long after its end at the latest.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime
from typing import Any, Final

from .protocol import OUTPUT_KEY

__all__ = ["TASK_AFTER", "TASK_TTL_MS", "POLL_MS", "OUTPUT_KEPT", "Task", "TaskTable"]

TASK_AFTER: Final = 1.0  # seconds a call may take before it is answered with a task instead
TASK_TTL_MS: Final = 3_600_000  # how long a task is kept (from its creation)
POLL_MS: Final = 500  # the polling interval suggested to clients
OUTPUT_KEPT: Final = 256 << 10  # output bytes a task keeps for tasks/get (the oldest go first)
# Tasks kept per table: beyond, the oldest finished one goes; when none has finished, a call is not
# made a task (it is answered at its end, as for a client without tasks). Bounds what tasks hold
# to MAX_TASKS * OUTPUT_KEPT (32 MiB).
MAX_TASKS: Final = 128

TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Task:
    """One task: its state, its final result, and the tail of the output its command wrote."""

    __slots__ = ("id", "rid", "status", "message", "result", "created", "updated", "chunks", "written", "kept", "input_requests")

    def __init__(self, rid: str) -> None:
        import secrets  # here, as in endpoint.py: not at every start

        self.id = secrets.token_urlsafe(18)  # unguessable: whoever holds it may read, write and cancel
        self.rid = rid  # the Smith request running it
        self.status = "working"
        self.message: str | None = None
        self.result: dict[str, Any] | None = None
        self.created = self.updated = time.time()
        self.chunks: deque[tuple[int, str, str]] = deque()  # (offset, stream, text), oldest first
        self.written = 0  # output bytes so far: the cursor of what comes next
        self.kept = 0  # bytes in chunks
        self.input_requests: dict[str, Any] | None = None

    def touch(self, status: str | None = None, message: str | None = None) -> None:
        if status is not None:
            self.status = status
        self.message = message
        self.updated = time.time()

    def output(self, stream: str, text: str, size: int) -> None:
        """The command wrote ``text`` (``size`` bytes) to ``stream``: keep it for ``tasks/get``."""
        self.chunks.append((self.written, stream, text))
        self.written += size
        self.kept += size
        while self.kept > OUTPUT_KEPT and len(self.chunks) > 1:
            self.chunks.popleft()
            self.kept = self.written - self.chunks[0][0]

    def since(self, cursor: int) -> dict[str, Any]:
        """The output after byte ``cursor``: per stream, in order, with the cursor to ask from next
        and the bytes that were no longer kept."""
        out: list[str] = []
        err: list[str] = []
        first = self.chunks[0][0] if self.chunks else self.written
        for offset, stream, text in self.chunks:
            if offset >= cursor:
                (out if stream == "stdout" else err).append(text)
            elif offset + len(text.encode()) > cursor:  # a chunk the cursor falls inside
                (out if stream == "stdout" else err).append(text.encode()[cursor - offset:].decode(errors="ignore"))
        return {"stdout": "".join(out), "stderr": "".join(err), "cursor": self.written, "skipped": max(0, first - cursor)}

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def handle(self) -> dict[str, Any]:
        """The ``CreateTaskResult`` of the call that made it."""
        return {"resultType": "task", **self._fields()}

    def detailed(self, cursor: int | None) -> dict[str, Any]:
        """The ``GetTaskResult``: the state, with the result, the input requests or the output as it has them."""
        result: dict[str, Any] = {"resultType": "complete", **self._fields()}
        if self.status == "completed" and self.result is not None:
            result["result"] = self.result
        elif self.status == "input_required" and self.input_requests is not None:
            result["inputRequests"] = self.input_requests
        if cursor is not None:
            result["_meta"] = {OUTPUT_KEY: self.since(cursor)}
        return result

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "taskId": self.id,
            "status": self.status,
            "createdAt": _stamp(self.created),
            "lastUpdatedAt": _stamp(self.updated),
            "ttlMs": TASK_TTL_MS,
            "pollIntervalMs": POLL_MS,
        }
        if self.message is not None:
            fields["statusMessage"] = self.message
        return fields


class TaskTable:
    """The tasks of one endpoint, by id."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def add(self, task: Task) -> bool:
        """Keep ``task``; False when the table is full of running ones."""
        self.sweep()
        if len(self.tasks) >= MAX_TASKS:
            done = [t for t in self.tasks.values() if t.finished]
            if not done:
                return False
            del self.tasks[min(done, key=lambda t: t.updated).id]
        self.tasks[task.id] = task
        return True

    def get(self, task_id: object) -> Task | None:
        return self.tasks.get(task_id) if isinstance(task_id, str) else None

    def sweep(self) -> None:
        """Forget the tasks past their time to live."""
        cutoff = time.time() - TASK_TTL_MS / 1000
        for task in [t for t in self.tasks.values() if t.created < cutoff and t.finished]:
            del self.tasks[task.id]
