"""A workspace per session (``serve --workspaces DIR``): copy-on-write from a template, checkpoints,
fork, diff, and what each request changed.

The pieces, each a module:

* ``namespace.py`` — ``enter(top)``: at start-up (the process still single-threaded) the service
  moves into a user and mount namespace of its own, forks the *mount host* (the one process that
  keeps the namespace's capabilities) and drops every capability itself; the mounts die with it.
* ``mount_host.py`` — :class:`MountHost`: the service's client of that process (tmpfs, overlay,
  replace, unmount; every path beneath ``top``).
* ``layers.py`` — the overlay's layers as directories: look a path up through a chain, what one
  layer changed, the diff of two chains, merging two layers, putting paths back (Undo).
* ``store.py`` / ``workspace.py`` — the core's :class:`WorkspaceStore` (templates, pool, checkpoint
  index, bounds, start-up cleanup) and one session's :class:`Workspace` (its chain, its tool context
  and sandbox, checkpoint/restore/diff/undo, per-request layers).

This module holds the values the others share and the protocol the command handlers call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..client_workspace import Change, ChangeKind

__all__ = ["ChangeKind", "FileChange", "ChangeSet", "WorkspaceOps", "CHANGE_KINDS", "TEMPLATE_KEY", "FORK_KEY"]

TEMPLATE_KEY = "smith_fast.template"
"""The handshake's ``client_info`` key naming the template of the session's workspace."""
FORK_KEY = "smith_fast.fork"
"""The handshake's ``client_info`` key naming the checkpoint a session starts from."""

CHANGE_KINDS: tuple[ChangeKind, ...] = ("added", "modified", "deleted")

FileChange = Change
"""One path that differs between two states of a workspace: the SDK's :class:`~smith_fast.client_workspace.Change`
(one value from the layers that compute it to the peer that reads it)."""


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """The changes of a request, of an Undo or of a Diff, sorted by path.

    Attributes:
        changes: the paths, sorted.
        exact: False when another request ran at the same time in the same workspace, so that
            its changes may be mixed in (``shared_with`` names them).
        shared_with: the request ids that shared the layer.
        truncated: the list or the unified diffs were cut at a limit.
    """

    changes: tuple[FileChange, ...] = ()
    exact: bool = True
    shared_with: tuple[str, ...] = ()
    truncated: bool = False


class WorkspaceOps(Protocol):
    """What the command handlers (Checkpoint, Restore, Diff, Undo) ask of a session's workspace.

    Every method raises :class:`~smith_fast.errors.ProtocolError` with ``details["reason"]`` for
    what it refuses (``unknown_checkpoint``, ``workspace_busy``, ``max_checkpoints``,
    ``changes_not_recorded``, ``undo_expired``, ``changes_shared``, ``unknown_request``).
    """

    @property
    def id(self) -> str:
        """The workspace id (``Ready.service_info["smith_fast.workspace"]``)."""
        ...

    @property
    def template(self) -> str:
        """The template's name."""
        ...

    @property
    def recording(self) -> bool:
        """The session accepted ``changes``: each request gets its own layer (:meth:`begin`/:meth:`end`)."""
        ...

    def begin(self, rid: str) -> None:
        """Request ``rid`` (a ShellExec, an ``fs.write``) is about to change files: give it a layer
        of its own when the workspace is quiet (synchronous: a mount host round trip)."""
        ...

    def end(self, rid: str) -> ChangeSet | None:
        """Request ``rid`` ended (before its final event): what it changed, None unless recording."""
        ...

    async def checkpoint(self, rid: str, label: str) -> tuple[str, int]:
        """Freeze the workspace as it is now: ``(checkpoint id, bytes the workspace holds)``."""
        ...

    async def restore(self, rid: str, checkpoint_id: str) -> list[str]:
        """Put the workspace back as it was at ``checkpoint_id``; the running requests of the
        session (but ``rid``) are cancelled first, its background processes killed: their ids."""
        ...

    async def diff(self, from_id: str, to_id: str | None, max_diff_bytes: int, paths: Sequence[str]) -> ChangeSet:
        """What differs from checkpoint ``from_id`` to ``to_id`` (None: the workspace now); only
        beneath ``paths`` when given; unified diffs up to ``max_diff_bytes`` in all."""
        ...

    async def undo(self, rid: str, target: str, force: bool) -> tuple[ChangeSet, list[str]]:
        """Put the paths request ``target`` changed back as they were before it: ``(what this
        undo changed, the paths a later request changed too, left alone unless force)``."""
        ...
