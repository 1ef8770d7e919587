"""What a session's workspace sees of it (:class:`~smith_fast.workspaces.workspace.SessionView`):
its live requests, to cancel them for a Restore, and the background processes started in it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .execution import BackgroundProcesses
    from .request_table import RequestTable

__all__ = ["SessionWorkspaceView"]


class SessionWorkspaceView:
    """The :class:`~smith_fast.workspaces.workspace.SessionView` of one session."""

    __slots__ = ("_requests", "_background")

    def __init__(self, requests: RequestTable, background: BackgroundProcesses) -> None:
        self._requests = requests
        self._background = background

    def live(self) -> list[str]:
        return [request.id for request in self._requests if not request.ended]

    def untouched(self) -> bool:
        return not self._requests.any_admitted()

    def cancel(self, rid: str, reason: str) -> None:
        request = self._requests.get(rid)
        if request is not None:
            request.cancel(reason)

    async def settle(self, rids: Sequence[str], timeout: float) -> None:
        tasks = [t for rid in rids if (r := self._requests.get(rid)) is not None and (t := r.task) is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def background(self, workspace: str) -> list[str]:
        return self._background.running_in(workspace)

    def stop_background(self, pids: Sequence[str]) -> None:
        for pid in pids:
            self._background.cancel(pid)
