"""The SDK's view of a session's workspace (PROTOCOL.md, "Workspaces"): what changed, as plain values,
and the commands :class:`~smith_fast.client.Client` sends for checkpoints, restore, diff and undo.

A service started with ``serve --workspaces DIR`` gives each session a copy-on-write workspace of a
template; :meth:`Client.checkpoint <smith_fast.client.Client.checkpoint>` freezes it,
``restore`` puts it back, ``diff`` compares two states and ``undo`` puts back what one request
changed. A client that asks for ``changes`` in its handshake gets, with each command's (and each
``fs.write``'s) result, the paths it changed (:attr:`RunResult.changes
<smith_fast.remote_process.RunResult.changes>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .pb import smith_pb2 as pb
from .request_ids import new_request_id

__all__ = [
    "CHANGES",
    "FORK_KEY",
    "TEMPLATE_KEY",
    "WORKSPACE_KEY",
    "Change",
    "ChangeKind",
    "UndoResult",
    "change_of",
    "changes_of",
    "checkpoint_command",
    "diff_command",
    "restore_command",
    "undo_command",
]

CHANGES = "changes"  # the handshake addition (smith_fast.accept) that asks for what each request changed
TEMPLATE_KEY = "smith_fast.template"  # client_info: the template the session's workspace is a copy of
FORK_KEY = "smith_fast.fork"  # client_info: a checkpoint the session's workspace starts from instead
WORKSPACE_KEY = "smith_fast.workspace"  # service_info: the session's workspace id (and TEMPLATE_KEY: its template)

ChangeKind = Literal["added", "modified", "deleted"]

_KINDS: dict[int, ChangeKind] = {
    pb.CHANGE_KIND_ADDED: "added",
    pb.CHANGE_KIND_MODIFIED: "modified",
    pb.CHANGE_KIND_DELETED: "deleted",
}


@dataclass(frozen=True, slots=True)
class Change:
    """One path that differs (a ``FileChange``).

    Attributes:
        path: relative to the workspace root, no leading ``/``.
        kind: ``added``, ``modified`` or ``deleted``.
        size: its size after the change (0 when deleted).
        old_size: its size before (0 when added).
        file_type: ``file``, ``dir``, ``symlink`` or ``other``.
        unified_diff: a Diff's unified diff of a text file (within ``max_diff_bytes``), else ``""``.
    """

    path: str
    kind: ChangeKind
    size: int = 0
    old_size: int = 0
    file_type: str = "file"
    unified_diff: str = ""

    @property
    def letter(self) -> str:
        """``A``, ``M`` or ``D`` (as ``git status --short``)."""
        return self.kind[0].upper()


@dataclass(frozen=True, slots=True)
class UndoResult:
    """What :meth:`Client.undo <smith_fast.client.Client.undo>` did.

    Attributes:
        changes: the paths it put back.
        conflicts: the paths a later request changed too, left alone (``force`` puts them back as well).
    """

    changes: list[Change] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def change_of(wire: pb.FileChange) -> Change:
    """A ``FileChange`` as a :class:`Change` (an unknown kind reads as ``modified``)."""
    return Change(wire.path, _KINDS.get(wire.kind, "modified"), wire.size, wire.old_size, wire.file_type or "file", wire.unified_diff)


def changes_of(wire: Sequence[pb.FileChange]) -> list[Change]:
    """``FileChange``s as :class:`Change` objects, in their order (sorted by path)."""
    return [change_of(c) for c in wire]


def _rid(request_id: str | None) -> str:
    return request_id or new_request_id()


def checkpoint_command(label: str = "", *, request_id: str | None = None) -> pb.Command:
    """The ``Checkpoint`` :meth:`Client.checkpoint <smith_fast.client.Client.checkpoint>` sends."""
    return pb.Command(checkpoint=pb.CheckpointCommand(request_id=_rid(request_id), label=label))


def restore_command(checkpoint_id: str, *, request_id: str | None = None) -> pb.Command:
    """The ``Restore`` :meth:`Client.restore <smith_fast.client.Client.restore>` sends."""
    return pb.Command(restore=pb.RestoreCommand(request_id=_rid(request_id), checkpoint_id=checkpoint_id))


def diff_command(from_id: str, to_id: str | None = None, *, max_diff_bytes: int = 0, paths: Sequence[str] = (),
                 request_id: str | None = None) -> pb.Command:
    """The ``Diff`` :meth:`Client.diff <smith_fast.client.Client.diff>` sends (``to_id`` None: the workspace now).

    Raises:
        ValueError: ``max_diff_bytes`` is negative or does not fit in 32 bits; ``paths`` is a string.
    """
    if not 0 <= max_diff_bytes < 1 << 32:
        raise ValueError(f"max_diff_bytes must be 0 (the service's default) to {(1 << 32) - 1}, not {max_diff_bytes}")
    if isinstance(paths, str):  # a str is a Sequence[str] of its characters: surely not what was meant
        raise ValueError(f"paths must be a list of paths, not the string {paths!r}")
    return pb.Command(diff=pb.DiffCommand(
        request_id=_rid(request_id), from_id=from_id, to_id=to_id or "", max_diff_bytes=max_diff_bytes, paths=list(paths),
    ))


def undo_command(target_request_id: str, *, force: bool = False, request_id: str | None = None) -> pb.Command:
    """The ``Undo`` :meth:`Client.undo <smith_fast.client.Client.undo>` sends."""
    return pb.Command(undo=pb.UndoCommand(request_id=_rid(request_id), target_request_id=target_request_id, force=force))
