"""The core's workspaces: templates, volumes, checkpoints, the warm pool, bounds, start-up cleanup.

On disk (``--workspaces DIR``)::

    DIR/.lock             flock: one service per DIR; at start whatever an earlier one left is removed
    DIR/s/<vid>/          a volume: a tmpfs of --max-workspace-bytes mounted by the mount host
            root/         the session's overlay (lowerdir = its layers, top first, then the template)
            upper.N/ work.N/   the overlay's upper and work directories (N grows at each freeze)
            layers/N/     frozen uppers: checkpoints and per-request layers, never written again

A volume outlives its session while a checkpoint or another session's chain uses one of its layers
(``Volume.holders``): a fork's lower layers live in the volume of the session it was forked from.
The mounts live in the service's own mount namespace (:mod:`.namespace`), so they vanish with it,
even after a SIGKILL; the next start removes the empty directories left on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import pathlib
import secrets
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from . import FORK_KEY, TEMPLATE_KEY

if TYPE_CHECKING:
    from ..sandbox import Sandbox
    from ..tools import ToolContext
    from .mount_host import MountHost

__all__ = ["Checkpoint", "Layer", "Scope", "Template", "Volume", "WorkspaceLimits", "WorkspaceStore"]

log = get_logger("smith_fast.workspaces")


_INODES_PER_MIB = 256  # the volume's inode bound: about one inode per 4 KiB of --max-workspace-bytes


@dataclass(frozen=True, slots=True)
class Template:
    """An operator's template: used in place as the lowest, read-only layer of its workspaces."""

    name: str
    path: str


class Volume:
    """One tmpfs under ``DIR/s``: a session's writable storage, its upper and its frozen layers."""

    __slots__ = ("path", "holders", "_next")

    def __init__(self, path: str) -> None:
        self.path = path
        self.holders = 0  # its workspace, checkpoints and chains of other workspaces using its layers
        self._next = 0

    def fresh(self, kind: str) -> str:
        """A new directory name in the volume (``upper``, ``work``, ``layers/`` …), made."""
        path = self.name(kind)
        os.mkdir(path, 0o755)
        return path

    def name(self, kind: str) -> str:
        """A new name in the volume, not made."""
        self._next += 1
        return f"{self.path}/{kind}{self._next}"

    def used(self) -> int:
        """Bytes the volume holds (its tmpfs's used blocks)."""
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize


@dataclass(frozen=True, slots=True)
class Layer:
    """A frozen upper: a directory in ``volume`` that nothing writes to again."""

    path: str
    volume: Volume = field(compare=False)


@dataclass(slots=True)
class Checkpoint:
    """A workspace frozen at a moment: its template and its chain of layers (top first)."""

    id: str
    template: Template
    chain: tuple[Layer, ...]
    owner: str  # the workspace id that took it
    label: str = ""
    expiry: asyncio.TimerHandle | None = None  # set once its workspace ended (--checkpoint-ttl)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a workspace of one volume starts with: its home (made), its sandbox and its tool context
    (whose root fd pins the overlay mounted then)."""

    home: str
    sandbox: Sandbox
    context: ToolContext


@dataclass(slots=True)
class _Warm:
    """A workspace mounted ahead of any handshake (``--warm-workspaces``); ``scope`` made ahead too
    (a handshake that takes it skips ~0.3 ms of building sandboxes and contexts)."""

    volume: Volume
    upper: str
    work: str
    scope: Scope | None = None


class WorkspaceLimits(Protocol):
    """The bounds a store applies (:class:`~smith_fast.service.config.Limits` is one)."""

    @property
    def max_workspace_bytes(self) -> int: ...

    @property
    def max_workspaces(self) -> int: ...

    @property
    def max_checkpoints(self) -> int: ...

    @property
    def max_undo(self) -> int: ...

    @property
    def max_diff_bytes(self) -> int: ...

    @property
    def warm_workspaces(self) -> int: ...

    @property
    def checkpoint_ttl(self) -> float: ...

    @property
    def kill_grace(self) -> float: ...


class OpenWorkspace(Protocol):
    """What the store knows of a session's workspace (:class:`~.workspace.Workspace`)."""

    @property
    def id(self) -> str: ...

    def in_use(self) -> set[str]:
        """The frozen layer directories it may still read."""
        ...

    def close(self) -> None: ...


class WorkspaceStore:
    """Every workspace of one service.

    Args:
        top: ``--workspaces DIR``.
        templates: name → directory (``--template``), the first the default.
        limits: the bounds.
        host: the mount host (:func:`.namespace.enter` made it at start-up).
        sandbox: the core's sandbox, narrowed per workspace (:meth:`Sandbox.for_workspace`).
        context: the core's tool context, copied per workspace with its root and sandbox.
        route: what checkpoint ids start with (a NATS worker's id: a fork is placed on the worker
            that holds its layers); "" on ``serve``.

    Raises:
        StartupError: another service uses ``DIR``.
    """

    def __init__(self, top: pathlib.Path, templates: Mapping[str, pathlib.Path], limits: WorkspaceLimits, host: MountHost,
                 sandbox: Sandbox, context: ToolContext, route: str = "") -> None:
        from ..errors import StartupError

        self.limits = limits
        self.top = str(top.resolve())
        self.host = host
        self.route = route
        self.templates = {name: Template(name, str(path)) for name, path in templates.items()}
        self.default = next(iter(self.templates.values()))
        self.sandbox = sandbox
        self.context = context
        self.workspaces: set[OpenWorkspace] = set()
        self.checkpoints: dict[str, Checkpoint] = {}  # an index by id: each is held by its chain's volumes
        self._warm: dict[str, list[_Warm]] = {name: [] for name in self.templates}
        self._filling: set[str] = set()
        os.makedirs(self.top, mode=0o700, exist_ok=True)
        self._lock = os.open(f"{self.top}/.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise StartupError(f"--workspaces {self.top}: another smith-fast service uses it; give each service its own directory") from None
        self._sweep()

    # ---- lifecycle of the store ---------------------------------------------------------------

    def _sweep(self) -> None:
        """Remove what an earlier service left in ``DIR/s`` (its mounts went with its namespace: what
        is left are the empty directories they were mounted on)."""
        sessions = f"{self.top}/s"
        if os.path.isdir(sessions):
            for name in os.listdir(sessions):
                shutil.rmtree(f"{sessions}/{name}", ignore_errors=True)
                if os.path.lexists(f"{sessions}/{name}"):  # something mounted there after all, or a work dir
                    self.host.call("rmtree", path=f"{sessions}/{name}")
        os.makedirs(sessions, mode=0o700, exist_ok=True)

    def hidden(self) -> tuple[str, ...]:
        """The templates' host paths: covered in every command's view (a command sees its template
        only through its own workspace, so it cannot write the original)."""
        return tuple(t.path for t in self.templates.values())

    def close(self) -> None:
        """The service stops: every mount goes with its namespace; only the lock is released."""
        for ws in list(self.workspaces):
            ws.close()
        os.close(self._lock)

    # ---- volumes ------------------------------------------------------------------------------

    def _made(self, chain: Sequence[Layer], template: Template, host: MountHost | None = None) -> _Warm:
        """A new volume with the overlay of ``chain`` over ``template`` mounted at its root: one round
        trip to the mount host (its tmpfs, its directories, the overlay); ``host``: which (the
        idle one for the warm pool)."""
        path = f"{self.top}/s/{secrets.token_hex(6)}"
        os.mkdir(path, 0o700)
        volume = Volume(path)
        upper, work = volume.name("upper"), volume.name("work")
        size = self.limits.max_workspace_bytes
        lowers = [layer.path for layer in chain] + [template.path]
        try:
            (host or self.host).call("batch", ops=[
                {"op": "tmpfs", "path": path, "size_bytes": size, "inodes": max(1024, (size >> 20) * _INODES_PER_MIB)},
                *({"op": "mkdir", "path": d} for d in (f"{path}/root", f"{path}/layers", upper, work)),
                {"op": "overlay", "target": f"{path}/root", "lowers": lowers, "upper": upper, "work": work},
            ])
        except BaseException:
            self._remove([path], root=None)
            raise
        return _Warm(volume, upper, work)

    def _remove(self, volumes: Sequence[str], root: str | None) -> None:
        """Unmount (``root``'s overlay, then) ``volumes``' tmpfs and remove their directories."""
        ops: list[dict[str, object]] = [{"op": "umount", "path": root}] if root is not None else []
        for path in volumes:
            ops.append({"op": "umount", "path": path})
        try:
            if ops:
                self.host.idle.call("batch", ops=ops)
        except OSError:
            pass  # not mounted (a volume whose tmpfs failed), or the next start removes it
        for path in volumes:
            try:
                os.rmdir(path)
            except OSError as exc:
                log.warning("a workspace volume could not be removed", extra={"fields": {"path": path, "error": str(exc)}})

    def release(self, root: str | None, volumes: Iterable[Volume]) -> None:
        """Unmount ``root`` and let go of ``volumes``: the mount host's round trip in a thread, so that
        a session's end never holds the loop (or a handshake) behind the mount host."""
        gone = [v.path for v in self._let_go(volumes)]
        if root is None and not gone:
            return
        self.host.idle.later(self._remove, gone, root)

    def recycle(self, volume: Volume, template: Template, upper: str, work: str, scope: Scope) -> None:
        """A pristine workspace's session ended (:meth:`.workspace.Workspace.close` says when):
        its volume goes back to the warm pool as it is (no mount made or undone), the next one
        taken; a pool past ``--warm-workspaces`` lets its oldest go (without a pool: this one)."""
        pool = self._warm.get(template.name)
        if pool is None or self.limits.warm_workspaces <= 0:
            self.release(f"{volume.path}/root", [volume])
            return
        self._let_go([volume])  # a warm volume is held by nobody until a session takes it
        self._pooled(pool, _Warm(volume, upper, work, scope), next_taken=True)

    def _pooled(self, pool: list[_Warm], warm: _Warm, *, next_taken: bool) -> None:
        """Put ``warm`` in ``pool``: taken next (a recycled volume: its dentries are warm too) or
        last (a refill); past ``--warm-workspaces`` (a refill done while a recycled one came
        back), the one taken last is let go."""
        if next_taken:
            pool.append(warm)  # _take pops from the end
        else:
            pool.insert(0, warm)
        while len(pool) > self.limits.warm_workspaces:
            extra = pool.pop(0)
            self.hold([extra.volume])  # held by nobody in the pool: held so that release lets go of it
            self.release(f"{extra.volume.path}/root", [extra.volume])

    def hold(self, volumes: Iterable[Volume]) -> None:
        for volume in set(volumes):
            volume.holders += 1

    def drop(self, volumes: Iterable[Volume]) -> None:
        """Let go of ``volumes``; one that nobody holds any more is unmounted (its memory freed)."""
        self.release(None, volumes)

    @staticmethod
    def _let_go(volumes: Iterable[Volume]) -> list[Volume]:
        gone = []
        for volume in set(volumes):
            volume.holders -= 1
            if volume.holders <= 0:
                gone.append(volume)
        return gone

    @staticmethod
    def volumes(chain: Sequence[Layer]) -> set[Volume]:
        return {layer.volume for layer in chain}

    def scope(self, volume: Volume) -> Scope:
        """The home, sandbox and tool context of a workspace of ``volume`` (its overlay mounted)."""
        root, home = f"{volume.path}/root", f"{volume.path}/home"
        # The session's home (HOME, the tool caches: service/session_home.py) is in its volume, so the
        # volume's tmpfs bounds it too; the workspaces directory is covered already.
        os.makedirs(home, 0o700, exist_ok=True)
        sandbox = self.sandbox.for_workspace(root, self.top, self.hidden()).with_home(home)
        return Scope(home, sandbox, self.context_for(root, sandbox))

    def context_for(self, root: str, sandbox: Sandbox) -> ToolContext:
        """The core's tool context with ``root`` and ``sandbox`` (made again after each remount)."""
        return dataclasses.replace(self.context, root=pathlib.Path(root), sandbox=sandbox)

    def mount(self, root: str, chain: Sequence[Layer], template: Template, upper: str, work: str, *, replace: bool) -> None:
        """Mount (or replace) the overlay at ``root``: ``chain`` (top first) over ``template``."""
        lowers = [layer.path for layer in chain] + [template.path]
        self.host.call("replace" if replace else "overlay", target=root, lowers=lowers, upper=upper, work=work)

    # ---- sessions -----------------------------------------------------------------------------

    def open(self, template_name: str | None, fork: str | None) -> tuple[Volume, Template, tuple[Layer, ...], str, str, Scope]:
        """The mounted parts of a session's workspace starting now (its handshake):
        ``(volume, template, chain, upper, work, scope)``, held (:func:`.workspace.open_workspace` makes the
        :class:`~.workspace.Workspace` of them and :meth:`add` s it).

        Raises:
            ProtocolError: an unknown template (``unknown_template``) or checkpoint
                (``unknown_checkpoint``), ``--max-workspaces`` reached (``max_workspaces``), the
                mounts failed (``workspace_failed``).
        """
        if len(self.workspaces) >= self.limits.max_workspaces:
            raise ProtocolError(
                f"this service has {len(self.workspaces)} workspaces, its limit (--max-workspaces); try again later",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, details={"reason": "max_workspaces"},
            )
        chain: tuple[Layer, ...] = ()
        if fork:
            checkpoint = self.checkpoints.get(fork)
            if checkpoint is None:
                raise ProtocolError(f"{FORK_KEY}: no checkpoint {fork!r} here (expired, or taken on another service)",
                                    pb.ERROR_CODE_UNSPECIFIED, details={"reason": "unknown_checkpoint"})
            template, chain = checkpoint.template, checkpoint.chain
        elif template_name:
            found = self.templates.get(template_name)
            if found is None:
                raise ProtocolError(
                    f"{TEMPLATE_KEY}: no template {template_name!r} here; this service has {', '.join(sorted(self.templates))}",
                    pb.ERROR_CODE_UNSPECIFIED, details={"reason": "unknown_template", "templates": ",".join(sorted(self.templates))},
                )
            template = found
        else:
            template = self.default
        try:
            warm = self._take(template) if not chain else None
            if warm is None:
                warm = self._made(chain, template)
        except OSError as exc:
            log.error("a workspace could not be made", extra={"fields": {"error": str(exc)}})
            raise ProtocolError(f"the workspace could not be made: {exc}", pb.ERROR_CODE_INTERNAL_ERROR,
                                details={"reason": "workspace_failed"}) from None
        self.hold([warm.volume])
        self.hold(self.volumes(chain))
        self._refill(template)
        return warm.volume, template, chain, warm.upper, warm.work, warm.scope or self.scope(warm.volume)

    def add(self, ws: OpenWorkspace) -> None:
        self.workspaces.add(ws)

    def ended(self, ws: OpenWorkspace) -> None:
        """``ws``'s session is over: its checkpoints stay usable for ``--checkpoint-ttl``."""
        self.workspaces.discard(ws)
        loop = asyncio.get_running_loop()
        for checkpoint in list(self.checkpoints.values()):
            if checkpoint.owner == ws.id and checkpoint.expiry is None:
                checkpoint.expiry = loop.call_later(self.limits.checkpoint_ttl, self.forget, checkpoint.id)

    # ---- checkpoints ----------------------------------------------------------------------------

    def add_checkpoint(self, owner: str, template: Template, chain: Sequence[Layer], label: str) -> Checkpoint:
        secret = secrets.token_urlsafe(12)
        cid = f"ck_{self.route}.{secret}" if self.route else f"ck_{secret}"
        checkpoint = Checkpoint(cid, template, tuple(chain), owner, label)
        self.checkpoints[cid] = checkpoint
        self.hold(self.volumes(checkpoint.chain))
        return checkpoint

    def owned(self, owner: str) -> list[Checkpoint]:
        return [c for c in self.checkpoints.values() if c.owner == owner]

    def forget(self, cid: str) -> None:
        checkpoint = self.checkpoints.pop(cid, None)
        if checkpoint is not None:
            if checkpoint.expiry is not None:
                checkpoint.expiry.cancel()
            self.drop(self.volumes(checkpoint.chain))

    def prune(self, volume: Volume) -> None:
        """Remove the frozen directories of ``volume`` that no workspace or checkpoint may read any
        more (layers merged away, requests too old to undo): their memory back, in a thread (a
        command may have made a directory of mode 000 there: the mount host removes it)."""
        used: set[str] = set()
        for ws in self.workspaces:
            used |= ws.in_use()
        for checkpoint in self.checkpoints.values():
            used.update(layer.path for layer in checkpoint.chain)
        top = f"{volume.path}/layers"
        try:
            gone = [path for path in (f"{top}/{name}" for name in os.listdir(top)) if path not in used]
        except OSError:
            return
        if not gone:
            return

        def remove() -> None:
            try:
                self.host.idle.call("batch", ops=[{"op": "rmtree", "path": path} for path in gone])
            except OSError as exc:
                log.warning("frozen layers could not be removed", extra={"fields": {"volume": volume.path, "error": str(exc)}})

        self.host.idle.later(remove)

    # ---- the warm pool ------------------------------------------------------------------------

    def _take(self, template: Template) -> _Warm | None:
        pool = self._warm.get(template.name)
        return pool.pop() if pool else None

    def _refill(self, template: Template) -> None:
        """Mount workspaces ahead in a thread (the mount host's round trips block), up to ``--warm-workspaces``."""
        if self.limits.warm_workspaces <= 0 or template.name in self._filling:
            return
        self._filling.add(template.name)
        loop = asyncio.get_running_loop()

        async def fill() -> None:
            pool = self._warm[template.name]
            try:
                while len(pool) < self.limits.warm_workspaces:
                    warm = await self.host.idle.in_thread(self._prepare, template)
                    warm.scope = self.scope(warm.volume)  # on the loop, between handshakes
                    self._pooled(pool, warm, next_taken=False)
            except OSError as exc:
                log.warning("a warm workspace could not be made", extra={"fields": {"error": str(exc)}})
            finally:
                self._filling.discard(template.name)

        task = loop.create_task(fill())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)

    def _prepare(self, template: Template) -> _Warm:
        return self._made((), template, self.host.idle)

    def warm(self) -> None:
        """Start filling every template's pool (at start-up)."""
        for template in self.templates.values():
            self._refill(template)


_TASKS: set[asyncio.Task[None]] = set()

