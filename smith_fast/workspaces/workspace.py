"""One session's workspace: its overlay, its chain of layers, checkpoints, restore, diff, undo, and
the layer of each request when the peer asked for ``changes``.

A *freeze* turns the live upper directory into a frozen layer: rename it within the volume (the
same tmpfs: O(1)), make a fresh upper and work directory, and replace the overlay at the root with
one whose lower chain is one layer longer. It is done only while the workspace is *quiet* (no other
request of the session runs, no background process of it writes): the frozen directory must never
be written again. Checkpoint, per-request layers and Undo are freezes; Restore and fork mount a
checkpoint's chain under a fresh upper. A recorded request's upper is frozen as soon as the request
ended (its final event sent) and the workspace is quiet, on the loop, so that the next request
starts on an empty upper rather than waiting for the remount; when a request came first, its
:meth:`Workspace.begin` freezes, as before.

A workspace whose session never had a request goes back to the warm pool as it is
(:meth:`Workspace.close`, :meth:`~.store.WorkspaceStore.recycle`).

After each remount the root is another mount: the tool context (whose root fd pins a mount) is
made again and handed to :meth:`Workspace.watch`'s callbacks (the session's runner).
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.session_home import remove_tree
from . import ChangeSet, layers
from .store import Scope

if TYPE_CHECKING:
    from ..sandbox import Sandbox
    from ..tools import ToolContext
    from .store import Layer, Template, Volume, WorkspaceStore

__all__ = ["SessionView", "Workspace", "open_workspace"]

log = get_logger("smith_fast.workspaces")


class SessionView(Protocol):
    """What a workspace sees of its session."""

    def live(self) -> list[str]:
        """The ids of the session's requests that have not ended."""
        ...

    def untouched(self) -> bool:
        """Whether the session never had a request (so no process of it ever ran, none can be
        left behind, and nothing of it wrote in the workspace)."""
        ...

    def cancel(self, rid: str, reason: str) -> None:
        """Cancel live request ``rid``; its ErrorEvent says ``reason``."""
        ...

    async def settle(self, rids: Sequence[str], timeout: float) -> None:
        """Return once requests ``rids`` ended (or ``timeout`` passed)."""
        ...

    def background(self, workspace: str) -> list[str]:
        """The running background processes started in workspace ``workspace``."""
        ...

    def stop_background(self, pids: Sequence[str]) -> None:
        """Cancel background processes ``pids``."""
        ...


_PRUNE_EVERY = 16
"""Segments forgotten between two prunes of the volume's unused frozen directories."""

_MOUNTED_LAYERS = 64
"""Lower layers mounted at most besides inherited ones: past it the oldest of its own are merged
(overlayfs takes 500, and a lookup in the workspace walks them all)."""


class _Segment:
    """The requests whose changes went into one upper: one request alone, or several that ran at once.
    Once frozen: its layer (a directory nothing writes again) and the mounted chain below it then,
    which is what Undo puts back (merging later never touches either directory)."""

    __slots__ = ("rids", "layer", "below", "shared")

    def __init__(self, rid: str) -> None:
        self.rids = {rid}
        self.layer: Layer | None = None  # once frozen
        self.below: tuple[Layer, ...] = ()
        self.shared = False


def _retrieved(future: asyncio.Future[None]) -> None:
    """A background freeze's failure is not an error of anyone's (the next request's begin freezes)."""
    if not future.cancelled():
        future.exception()


def _drop_later(held: list[object]) -> None:
    """Let go of ``held``'s items in a worker thread (their finalisers run there)."""
    try:
        asyncio.get_running_loop().run_in_executor(None, held.clear)
    except RuntimeError:
        held.clear()


def _busy(what: str, running: Sequence[str]) -> ProtocolError:
    return ProtocolError(
        f"{what} needs the workspace quiet, and {', '.join(running)} still run{'s' if len(running) == 1 else ''}: wait for "
        "them (or cancel them) and send it again",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED, details={"reason": "workspace_busy", "running": ",".join(running)},
    )


class Workspace:
    """A session's copy-on-write workspace (:class:`~smith_fast.workspaces.WorkspaceOps`)."""

    def __init__(self, store: WorkspaceStore, session: SessionView, volume: Volume, template: Template,
                 chain: list[Layer], upper: str, work: str, scope: Scope) -> None:
        self._store = store
        self._session = session
        self.volume = volume
        self.id = os.path.basename(volume.path)
        self._template = template
        self.chain = chain  # frozen layers, top first (the template below them)
        self.upper = upper
        self.work = work
        self.root = f"{volume.path}/root"
        self.recording = False  # set by the session when the peer accepted "changes"
        self.home = scope.home
        self.sandbox: Sandbox = scope.sandbox
        self.tool_context = scope.context
        self._watchers: list[Callable[[ToolContext], None]] = []
        self._segment: _Segment | None = None  # the live upper's, while a recorded request wrote there
        self._segments: collections.OrderedDict[str, _Segment] = collections.OrderedDict()  # request id → its segment
        self._forgotten: set[str] = set()  # ids whose layers went (--max-undo, a restore): undo_expired
        self._levels: dict[str, int] = {}  # frozen layer of its own → its merge level (_compacted)
        self._dropped = 0  # segments forgotten since the last prune
        self._frozen = layers.FrozenListings()  # the frozen layers' directories, read once
        # a merge running in a thread: (newer, older, the result's directory, its level)
        self._merging: tuple[Layer, Layer, str, int] | None = None
        self._merges: list[tuple[Layer, Layer, Layer]] = []  # merges done, not mounted yet: (newer, older, result)
        self._trash: list[str] = []  # work directories of replaced overlays (their 000 dirs need the mount host)
        self._eager: asyncio.Task[None] | None = None  # the freeze waiting for the last request's end
        self.closed = False

    @property
    def template(self) -> str:
        return self._template.name

    def _context(self) -> ToolContext:
        return self._store.context_for(self.root, self.sandbox)

    def watch(self, callback: Callable[[ToolContext], None]) -> None:
        """Call ``callback`` with the new tool context after every remount of the root."""
        self._watchers.append(callback)

    def info(self) -> dict[str, str]:
        """What ``Ready.service_info`` says of it."""
        return {"smith_fast.workspace": self.id, "smith_fast.template": self._template.name, "smith_fast.workspace_root": self.root}

    # ---- freezing -----------------------------------------------------------------------------

    def _inherited(self, chain: Sequence[Layer]) -> set[Volume]:
        """The volumes of ``chain`` but this workspace's own: what it holds for its chain (its own
        volume it holds once, for its whole life)."""
        return self._store.volumes(chain) - {self.volume}

    def _lowers(self, chain: Sequence[Layer] | None = None) -> list[str]:
        return [layer.path for layer in (self.chain if chain is None else chain)] + [self._template.path]

    def _upper_empty(self) -> bool:
        with os.scandir(self.upper) as it:
            return next(it, None) is None

    def _remount(self, chain: list[Layer]) -> None:
        """Mount ``chain`` under a fresh upper at the root, replacing what was there."""
        upper, work = self.volume.fresh("upper"), self.volume.fresh("work")
        self._store.mount(self.root, chain, self._template, upper, work, replace=True)
        self._trash.append(self.work)
        self.upper, self.work = upper, work
        self.chain = chain
        old: list[object] = [self.tool_context]
        self.tool_context = self._context()
        for callback in self._watchers:
            callback(self.tool_context)
        # The old context's root fd holds the replaced overlay: closing it tears the overlay down
        # (~0.3 ms of the kernel's), in a thread rather than on the loop (when nothing else holds it).
        _drop_later(old)
        if len(self._trash) >= 32:
            self._empty_trash()

    def _empty_trash(self) -> None:
        """Remove the work directories of replaced overlays: by the idle mount host, in its thread
        (thirty-odd trees: ~10 ms that the request whose freeze filled the trash used to wait)."""
        trash, self._trash = self._trash, []
        host = self._store.host.idle

        def remove() -> None:
            for path in trash:  # one by one: a failure leaves only that one (the next start sweeps it)
                try:
                    host.call("rmtree", path=path)
                except OSError:
                    pass

        host.later(remove)

    def _freeze(self) -> Layer | None:
        """The live upper becomes the top frozen layer (nothing when it is empty)."""
        from .store import Layer

        if self._upper_empty():
            if self._segment is not None:  # wrote nothing: its layer is "none", as if frozen empty
                self._segment = None
            return None
        layer_path = self.volume.fresh("layers/")
        os.rmdir(layer_path)
        os.rename(self.upper, layer_path)
        layer = Layer(layer_path, self.volume)
        below = tuple(self.chain)
        self._levels[layer_path] = 0
        chain = self._compacted(self._merged([layer, *self.chain]))
        try:
            self._remount(chain)
        except BaseException:
            os.rename(layer_path, self.upper)
            raise
        if self._segment is not None:
            self._segment.layer = layer
            self._segment.below = below
            self._segment = None
        self._merge_next()
        return layer

    def _merge_next(self) -> None:
        """Start merging the newest two adjacent layers of its own of one level, in a thread, while
        requests run (frozen layers never change), and the next pair once that is done, on the chain
        as it will be: the next freeze mounts every merge done by then. So the layers mount as a
        binary counter's digits, about log2(n), at no cost to any request; a merge slower than a
        command only delays the mount of its result (with one merge started per freeze, each slow
        one left a layer more mounted until a freeze needed no merge)."""
        if self._merging is not None or self.closed:
            return
        chain, levels = self._planned(list(self.chain)), self._levels
        for i in range(len(chain) - 1):
            newer, older = chain[i], chain[i + 1]
            level = levels.get(newer.path)
            if level is not None and level == levels.get(older.path):
                out = self.volume.name("layers/")
                future = asyncio.get_running_loop().run_in_executor(None, layers.merge, older.path, newer.path, out)
                self._merging = (newer, older, out, level + 1)
                future.add_done_callback(self._merge_done)
                return

    def _merge_done(self, future: asyncio.Future[None]) -> None:
        merging, self._merging = self._merging, None
        if future.cancelled() or future.exception() is not None or merging is None:
            return  # its directory, if any, is removed by the next prune; the next freeze tries again
        from .store import Layer

        newer, older, out, level = merging
        self._levels[out] = level
        self._merges.append((newer, older, Layer(out, self.volume)))
        self._merge_next()

    def _planned(self, chain: list[Layer]) -> list[Layer]:
        """``chain`` with the merges done so far in place of the pairs they merged (a merge whose
        pair is no longer there, after a restore or a synchronous compaction, is left out)."""
        for newer, older, out in self._merges:
            for i in range(len(chain) - 1):
                if chain[i] == newer and chain[i + 1] == older:
                    chain[i : i + 2] = [out]
                    break
        return chain

    def _merged(self, chain: list[Layer]) -> list[Layer]:
        """``chain`` with the merges done so far, which it is about to mount."""
        chain = self._planned(chain)
        self._merges = []
        return chain

    def _compacted(self, chain: list[Layer]) -> list[Layer]:
        """``chain`` with its two oldest layers of its own merged while it has more than
        :data:`_MOUNTED_LAYERS` of them (the background merges of :meth:`_merge_next` keep it far
        below: this is the bound when requests come faster than merges). Hard links, no data copied;
        the frozen directories stay for Undo and the checkpoints that name them."""
        from .store import Layer

        def merge(i: int, level: int) -> None:
            newer, older = chain[i], chain[i + 1]
            out = self.volume.fresh("layers/")
            os.rmdir(out)
            layers.merge(older.path, newer.path, out)
            self._levels[out] = level
            chain[i : i + 2] = [Layer(out, self.volume)]

        levels = self._levels
        while sum(1 for layer in chain if layer.volume is self.volume) > _MOUNTED_LAYERS:
            pairs = [i for i in range(len(chain) - 1) if chain[i].volume is self.volume and chain[i + 1].volume is self.volume]
            if not pairs:
                break
            i = pairs[-1]
            merge(i, max(levels.get(chain[i].path, 0), levels.get(chain[i + 1].path, 0)) + 1)
        return chain

    def in_use(self) -> set[str]:
        """The frozen directories this workspace may still read: its mounted chain, the layers of
        the requests it can still undo with what lay below them, and a merge under way."""
        out = {layer.path for layer in self.chain}
        if self._merging is not None:
            out.update((self._merging[0].path, self._merging[1].path, self._merging[2]))
        for newer, older, merged in self._merges:
            out.update((newer.path, older.path, merged.path))
        for segment in self._segments.values():
            if segment.layer is not None:
                out.add(segment.layer.path)
                out.update(layer.path for layer in segment.below)
        return out

    def _forget(self, rid: str) -> None:
        self._forgotten.add(rid)
        self._dropped += 1
        if self._dropped >= _PRUNE_EVERY:
            self._dropped = 0
            self._store.prune(self.volume)

    def _others(self, rid: str) -> list[str]:
        return [r for r in self._session.live() if r != rid]

    def _quiet(self, rid: str) -> list[str]:
        """What keeps the workspace from being quiet for ``rid``: other live requests, background processes."""
        return self._others(rid) + self._session.background(self.id)

    # ---- per-request layers (WorkspaceOps.begin/end) -------------------------------------------

    def begin(self, rid: str) -> None:
        if not self.recording or self.closed:
            return
        live = self._session.live()
        writing = [r for r in live if r != rid and self._segment is not None and self._segments.get(r) is self._segment]
        background = self._session.background(self.id)
        if not writing and not background:
            self._freeze()  # what the previous request left in the upper becomes its layer
            self._segment = _Segment(rid)
        elif self._segment is None:  # only a background process writes meanwhile: its writes mix in
            self._segment = _Segment(rid)
            self._segment.shared = True
        else:  # another request is writing into the live upper: they share it
            self._segment.rids.add(rid)
            self._segment.shared = True
        self._segments[rid] = self._segment
        self._segments.move_to_end(rid)
        while len(self._segments) > self._store.limits.max_undo:
            old, _ = self._segments.popitem(last=False)
            self._forget(old)

    def end(self, rid: str) -> ChangeSet | None:
        segment = self._segments.get(rid)
        if not self.recording or segment is None or self.closed:
            return None
        if segment.layer is None and segment is not self._segment:
            return ChangeSet()  # frozen while empty: it wrote nothing
        if segment.layer is not None:
            top, below = segment.layer.path, self._lowers(segment.below)
        else:
            top, below = self.upper, self._lowers()
        changes = layers.layer_changes(top, below, frozen=self._frozen)
        if segment is self._segment and not segment.shared:
            self._freeze_after(rid)
        if segment.shared:
            return ChangeSet(changes.changes, exact=False, shared_with=tuple(sorted(segment.rids - {rid})), truncated=changes.truncated)
        return changes

    def _freeze_after(self, rid: str) -> None:
        """Freeze the upper ``rid`` wrote once ``rid`` has ended (its final event sent), when the
        workspace is quiet then: the next request's :meth:`begin` finds an empty upper and starts
        at once, instead of freezing (a remount, ~1 ms) between its arrival and its command."""
        if self._eager is not None:
            return
        task = asyncio.get_running_loop().create_task(self._eager_freeze(rid))
        self._eager = task
        task.add_done_callback(_retrieved)

    async def _eager_freeze(self, rid: str) -> None:
        try:
            await self._session.settle([rid], self._store.limits.kill_grace + 5.0)
            # One more turn of the loop: the request's final event and terminal state, written by
            # now, go out first (a connection flushes once per turn; this task's first step may
            # come before that flush, and a request already done does not make settle wait).
            await asyncio.sleep(0)
        finally:
            self._eager = None
        # Quiet as begin() wants it: no request of the session (a new one froze already), nothing
        # in the background writing. Synchronous on the loop: no request can start halfway.
        if self.closed or self._segment is None or self._session.live() or self._session.background(self.id):
            return
        try:
            self._freeze()
        except OSError as exc:  # the upper stays live: the next begin() freezes it (and says so)
            log.warning("a workspace could not be frozen after a request", extra={"fields": {"workspace": self.id, "error": str(exc)}})

    # ---- commands (WorkspaceOps) ----------------------------------------------------------------

    async def checkpoint(self, rid: str, label: str) -> tuple[str, int]:
        running = self._quiet(rid)
        if running:
            raise _busy("a Checkpoint", running)
        limit = self._store.limits.max_checkpoints
        if len(self._store.owned(self.id)) >= limit:
            raise ProtocolError(f"this session has {limit} checkpoints, its limit (--max-checkpoints)",
                                pb.ERROR_CODE_RESOURCE_EXHAUSTED, details={"reason": "max_checkpoints"})
        self._freeze()
        checkpoint = self._store.add_checkpoint(self.id, self._template, self.chain, label)
        return checkpoint.id, self.volume.used()

    def _checkpoint(self, cid: str) -> tuple[Template, tuple[Layer, ...]]:
        found = self._store.checkpoints.get(cid)
        if found is None:
            raise ProtocolError(f"no checkpoint {cid!r} here (expired, or taken on another service)", pb.ERROR_CODE_UNSPECIFIED,
                                details={"reason": "unknown_checkpoint"})
        return found.template, found.chain

    async def restore(self, rid: str, checkpoint_id: str) -> list[str]:
        template, chain = self._checkpoint(checkpoint_id)
        cancelled = self._others(rid)
        for other in cancelled:
            self._session.cancel(other, "restored")
        background = self._session.background(self.id)
        self._session.stop_background(background)
        grace = self._store.limits.kill_grace
        await self._session.settle(cancelled, grace + 5.0)
        for _ in range(int((grace + 5.0) / 0.05)):
            if not self._session.background(self.id):
                break
            await asyncio.sleep(0.05)
        old = self.chain
        self._store.hold(self._inherited(chain))
        self._template = template
        self._trash.append(self.upper)
        self._remount(list(chain))
        self._store.drop(self._inherited(old))
        self._segment = None
        self._forgotten.update(self._segments)
        self._segments.clear()
        return cancelled + background

    async def diff(self, from_id: str, to_id: str | None, max_diff_bytes: int, paths: Sequence[str]) -> ChangeSet:
        limit = self._store.limits.max_diff_bytes
        budget = min(max_diff_bytes, limit) if max_diff_bytes else limit
        from_template, from_chain = self._checkpoint(from_id)
        a = [layer.path for layer in from_chain] + [from_template.path]
        if to_id:
            to_template, to_chain = self._checkpoint(to_id)
            b = [layer.path for layer in to_chain] + [to_template.path]
        else:
            b = [self.upper, *self._lowers()]
        return await asyncio.to_thread(layers.diff, a, b, max_diff_bytes=budget, paths=paths)

    async def undo(self, rid: str, target: str, force: bool) -> tuple[ChangeSet, list[str]]:
        if not self.recording:
            raise ProtocolError("Undo needs the changes of each request: send smith_fast.accept=changes in the handshake",
                                pb.ERROR_CODE_UNSPECIFIED, details={"reason": "changes_not_recorded"})
        segment = self._segments.get(target)
        if segment is None:
            if target in self._forgotten:
                raise ProtocolError(f"request {target} is too old to undo (--max-undo, or a Restore since)", pb.ERROR_CODE_UNSPECIFIED,
                                    details={"reason": "undo_expired", "target": target})
            raise ProtocolError(f"no request {target} changed this workspace", pb.ERROR_CODE_UNSPECIFIED,
                                details={"reason": "unknown_request", "target": target})
        if segment.shared:
            raise ProtocolError(
                f"request {target} ran at the same time as {', '.join(sorted(segment.rids - {target}))}: its changes cannot be told "
                "apart from theirs", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "changes_shared", "target": target},
            )
        running = self._quiet(rid)
        if running:
            raise _busy("an Undo", running)
        if segment.layer is None and segment is self._segment:
            self._freeze()
        self.begin(rid)  # the undo's own layer: itself undoable
        if segment.layer is None:
            return ChangeSet(), []  # it wrote nothing
        below = self._lowers(segment.below)
        order = list(self._segments.values())
        later = [s.layer.path for s in order[order.index(segment) + 1 :] if s.layer is not None and s is not segment]
        later.append(self.upper)
        changed = layers.layer_changes(segment.layer.path, below)
        conflicts = [c.path for c in changed.changes if any(os.path.lexists(f"{top}/{c.path}") for top in later)]
        skip = set() if force else set(conflicts)
        # deepest paths last when putting back (a directory before its content), removals deepest first
        wanted = [c.path for c in changed.changes if c.path not in skip]
        await asyncio.to_thread(layers.restore_paths, self.root, wanted, below)
        made = self.end(rid) or ChangeSet()
        return made, conflicts

    # ---- end --------------------------------------------------------------------------------

    def _pristine(self) -> bool:
        """Whether the workspace is as the warm pool made it: its session never had a request (no
        process of it can be left to write later), it is no fork, nothing else holds its volume,
        and its upper, its home and its layers are empty (what only the service could have put
        there). Its mounts, sandbox and tool context then serve the next session as they are."""
        if self.chain or self.volume.holders != 1 or not self._session.untouched():
            return False
        try:
            return not (os.listdir(self.upper) or os.listdir(self.home) or os.listdir(f"{self.volume.path}/layers"))
        except OSError:
            return False

    def close(self) -> None:
        """The session is over: unmount its root; its volume goes once no checkpoint or fork uses it."""
        if self.closed:
            return
        self.closed = True
        store = self._store
        if self._pristine():
            store.ended(self)
            store.recycle(self.volume, self._template, self.upper, self.work, Scope(self.home, self.sandbox, self.tool_context))
            return
        if self.volume.holders > 1:  # checkpoints keep the volume: the home goes with the session (else with the tmpfs)
            try:
                remove_tree(self.home)
            except OSError:
                pass
        store.ended(self)
        store.release(self.root, [*self._inherited(self.chain), self.volume])


def open_workspace(store: WorkspaceStore, session: SessionView, template: str | None, fork: str | None) -> Workspace:
    """The workspace of a session starting now (its handshake), from ``template`` or checkpoint ``fork``.

    Raises:
        ProtocolError: what :meth:`WorkspaceStore.open` refuses.
    """
    volume, found, chain, upper, work, scope = store.open(template, fork)
    ws = Workspace(store, session, volume, found, list(chain), upper, work, scope)
    store.add(ws)
    return ws

