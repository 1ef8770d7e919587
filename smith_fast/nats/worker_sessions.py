"""What a gateway session keeps on a worker across its commands (:class:`SessionState`).

A worker runs each command (or batch) of a gateway session in a session of its own, so that every
event is known to belong to its command; what lasts longer lives here: the session's hooks (loaded
once per worker, from the hooks bucket when another worker loaded them, shared by its commands,
closed when the gateway session ends), its running command sessions, and whether its frontend is
reading (pause/resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import TYPE_CHECKING

from ..errors import ProtocolError
from ..hooks import Hook, HookLimits, load_hook
from ..pb import smith_pb2 as pb
from .hooks_bucket import HooksBucket
from .wire import hook_key

if TYPE_CHECKING:
    from ..service.session import Session

__all__ = ["SessionState", "Shelf"]


class Shelf:
    """Where a command's session keeps the hooks it loads: its gateway session's state on this worker.

    The state closes them when the gateway session ends, so closing a command's session leaves
    them alone. A hook loaded here (HookLoadCommand) is also stored in the hooks bucket, where the
    other workers find it.
    """

    __slots__ = ("_state",)

    def __init__(self, state: SessionState) -> None:
        self._state = state

    async def adopt(self, cmd: pb.HookLoadCommand, hook: Hook) -> Hook:
        key = hook_key(cmd.hook_type, cmd.script)
        cached = self._state.hooks.get(key)
        if cached is not None and cached is not hook:  # an earlier delivery of this command loaded it here
            await hook.close()
            return cached
        self._state.hooks[key] = hook
        return hook

    async def store(self, rid: str, cmd: pb.HookLoadCommand) -> None:
        try:
            await self._state.bucket.store(hook_key(cmd.hook_type, cmd.script), cmd)
        except Exception as exc:
            raise ProtocolError(
                f"hook loaded but its source could not be stored for the other workers: {exc}",
                pb.ERROR_CODE_INTERNAL_ERROR,
                rid,
                {"reason": "hook_store_failed"},
            ) from None


class SessionState:
    """What one gateway session keeps on this worker across its commands."""

    __slots__ = ("bucket", "limits", "session_id", "hooks", "loading", "running", "paused", "last_used")

    def __init__(self, bucket: HooksBucket, limits: HookLimits, session_id: str) -> None:
        self.bucket = bucket  # where the hooks of the session loaded by other workers are found
        self.limits = limits  # what a hook loaded here may use
        self.session_id = session_id
        self.hooks: dict[str, Hook] = {}
        self.loading: dict[str, asyncio.Task[Hook]] = {}
        self.running: set[Session] = set()
        self.paused = False
        self.last_used = time.monotonic()

    async def hooks_for(self, keys: tuple[str, ...]) -> list[Hook]:
        """The session's hooks, in load order, loading those this worker has not seen yet.

        Raises:
            HookLoadError: a hook's source is not in the bucket or does not load here.
        """
        out: list[Hook] = []
        for key in keys:
            hook = self.hooks.get(key)
            if hook is None:
                task = self.loading.get(key)
                if task is None:
                    task = asyncio.get_running_loop().create_task(self._load(key))
                    self.loading[key] = task
                    task.add_done_callback(functools.partial(self._loaded, key))
                hook = await asyncio.shield(task)
            out.append(hook)
        return out

    def _loaded(self, key: str, _task: asyncio.Task[Hook]) -> None:
        self.loading.pop(key, None)

    async def _load(self, key: str) -> Hook:
        cmd = await self.bucket.fetch(key)
        hook = await load_hook(cmd.hook_type, cmd.script, limits=self.limits)
        existing = self.hooks.setdefault(key, hook)
        if existing is not hook:
            await hook.close()
        return existing

    async def close(self) -> None:
        hooks = list(self.hooks.values())
        self.hooks.clear()
        for hook in hooks:
            with contextlib.suppress(Exception):
                await hook.close()
