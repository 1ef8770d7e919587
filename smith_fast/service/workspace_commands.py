"""Checkpoint, Restore, Diff and Undo (PROTOCOL.md, "Workspaces"), and what a request changed.

The four handlers ask the session's workspace (:class:`~smith_fast.workspaces.WorkspaceOps`, the
service's ``--workspaces``) and answer one ``WorkspaceEvent``; the runner then ends the request
(``READY``, or ``ERROR`` after the ``ErrorEvent`` of what the workspace refused).

A request that changes files (a ShellExec, an ``fs.write``) in a session that records changes
(it accepted ``changes`` in its handshake) is bracketed by :func:`begin` and :func:`end`: its own
layer, and what it changed in its final event (:func:`to_wire`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb

if TYPE_CHECKING:
    from ..workspaces import ChangeSet, FileChange, WorkspaceOps
    from .execution import Execution

__all__ = [
    "CHANGES",
    "RECORDED_TOOLS",
    "begin",
    "checkpoint",
    "diff",
    "end",
    "file_change",
    "needs_workspaces",
    "restore",
    "to_wire",
    "undo",
    "workspace_of",
]

CHANGES = "changes"  # the handshake addition (negotiation.ACCEPTABLE) that asks for FileChanges
RECORDED_TOOLS = frozenset({"fs.write"})  # the tools whose calls get a layer of their own, like a ShellExec

_KINDS = {"added": pb.CHANGE_KIND_ADDED, "modified": pb.CHANGE_KIND_MODIFIED, "deleted": pb.CHANGE_KIND_DELETED}


def workspace_of(ex: Execution, rid: str) -> WorkspaceOps:
    """The session's workspace.

    Raises:
        ProtocolError: the session has none (``no_workspace``): the service runs without ``--workspaces``.
    """
    ws = ex.workspace
    if ws is None:
        raise ProtocolError(
            "this session has no workspace: start the service with --workspaces DIR (and a template) to use "
            "checkpoints, restore, diff and undo",
            pb.ERROR_CODE_UNSPECIFIED,
            rid,
            {"reason": "no_workspace"},
        )
    return ws


def file_change(change: FileChange) -> pb.FileChange:
    """One :class:`~smith_fast.workspaces.FileChange` as the wire's ``FileChange``."""
    return pb.FileChange(
        path=change.path, kind=_KINDS[change.kind], size=change.size, old_size=change.old_size,
        file_type=change.file_type, unified_diff=change.unified_diff,
    )


def to_wire(changes: ChangeSet) -> pb.FileChanges:
    """A request's :class:`~smith_fast.workspaces.ChangeSet` as ``FileChanges``."""
    return pb.FileChanges(
        changes=[file_change(c) for c in changes.changes], exact=changes.exact,
        shared_with=list(changes.shared_with), truncated=changes.truncated,
    )


# ---- a request's own layer ---------------------------------------------------------------------


def begin(ex: Execution, rid: str) -> WorkspaceOps | None:
    """Request ``rid`` is about to change files: its own layer, when the session records changes.
    The workspace to :func:`end` with, or None (nothing to end)."""
    ws = ex.workspace
    if ws is None or not ws.recording:
        return None
    ws.begin(rid)
    return ws


def end(ex: Execution, ws: WorkspaceOps | None, rid: str) -> pb.FileChanges | None:
    """Request ``rid`` ended (before its final event): what it changed, for a peer that accepted
    ``changes``; None otherwise. Once per :func:`begin` that returned a workspace."""
    if ws is None:
        return None
    changes = ws.end(rid)
    if changes is None or not ex.wants(CHANGES):
        return None
    return to_wire(changes)


# ---- the handlers ------------------------------------------------------------------------------


def _answer(ex: Execution, event: pb.WorkspaceEvent) -> None:
    ex.sink.event(pb.Event(workspace=event))


async def checkpoint(ex: Execution, rid: str, cmd: pb.CheckpointCommand) -> None:
    """Freeze the workspace: the new checkpoint's id and the bytes the workspace holds."""
    checkpoint_id, held = await workspace_of(ex, rid).checkpoint(rid, cmd.label)
    _answer(ex, pb.WorkspaceEvent(request_id=rid, checkpoint_id=checkpoint_id, workspace_bytes=held))


async def restore(ex: Execution, rid: str, cmd: pb.RestoreCommand) -> None:
    """Put the workspace back as it was at a checkpoint; the ids of the requests that cancelled."""
    cancelled = await workspace_of(ex, rid).restore(rid, cmd.checkpoint_id)
    _answer(ex, pb.WorkspaceEvent(request_id=rid, checkpoint_id=cmd.checkpoint_id, cancelled=cancelled))


async def diff(ex: Execution, rid: str, cmd: pb.DiffCommand) -> None:
    """What differs between two checkpoints (or one and the workspace now). ``max_diff_bytes`` 0
    asks for the service's default; the workspace caps it at the service's limit."""
    changes = await workspace_of(ex, rid).diff(cmd.from_id, cmd.to_id or None, cmd.max_diff_bytes, list(cmd.paths))
    _answer(ex, pb.WorkspaceEvent(request_id=rid, changes=[file_change(c) for c in changes.changes], truncated=changes.truncated))


async def undo(ex: Execution, rid: str, cmd: pb.UndoCommand) -> None:
    """Put back what request ``target_request_id`` changed; the paths a later request changed too
    are left alone (unless ``force``) and named in ``conflicts``."""
    changes, conflicts = await workspace_of(ex, rid).undo(rid, cmd.target_request_id, cmd.force)
    _answer(ex, pb.WorkspaceEvent(request_id=rid, changes=[file_change(c) for c in changes.changes], conflicts=conflicts))


def needs_workspaces(_cmd: object) -> int:
    """The capability each of the four needs."""
    return pb.CAPABILITY_WORKSPACES
