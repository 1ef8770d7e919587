"""The overlay's layers as plain directories: lookups, changes, diffs, merges and Undo, no mounting.

A *chain* is a sequence of layer directories, TOP FIRST, the last one the template (a plain
directory used in place). The other layers are overlay upper directories, live or frozen, as the
kernel writes them in ``userxattr`` mode:

* a *whiteout* (a char device 0/0 named like the entry) hides that entry of every lower layer;
* an *opaque* directory (xattr ``user.overlay.opaque`` = ``y``) hides the content of the directory
  of the same name in every lower layer;
* a non-directory hides everything of that name below it, a directory over a lower non-directory
  stops the merge there;
* ``user.overlay.origin``, ``impure``, ``uuid`` … only help the kernel with inode numbers: ignored.
  The mount has no ``redirect_dir`` nor ``metacopy`` (``userxattr`` turns them off: renaming a
  directory that comes from a lower layer fails with ``EXDEV`` and ``mv`` copies instead), so a
  layer never points elsewhere and every file's data is where its name is.

Every function reads only what it needs: :func:`layer_changes` walks the one layer (looking each of
its names up in the layers below it, never listing the template), :func:`diff` walks only the
layers two chains do not share. A list of changes is sorted component by component
(:func:`path_key`: a directory right before its content), so the first ``limit`` of the walk are
the first ``limit`` of the sorted answer and a cut list is a prefix of the whole one.

Paths are POSIX and relative to the layer root (no leading ``/``, no ``..``).
"""

from __future__ import annotations

import difflib
import errno
import collections
import os
import secrets
import shutil
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.tools.openat2 import open_beneath
from smith_fast.workspaces import ChangeKind, ChangeSet, FileChange

__all__ = [
    "OPAQUE_XATTR",
    "is_whiteout",
    "is_opaque",
    "lookup",
    "layer_changes",
    "diff",
    "merge",
    "restore_paths",
    "path_key",
    "normal_path",
    "entries_scanned",
]

OPAQUE_XATTR = "user.overlay.opaque"
_OVERLAY_XATTRS = "user.overlay."
_CHUNK = 1 << 20
_SNIFF = 8192  # what git reads to call a file binary
_NO_XATTR = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
_GONE = (errno.ENOENT, errno.ENOTDIR)

# How many directory entries the walks read (the cost that matters): the tests read it to check
# that a diff walks only the layers the chains do not share, and a bench can read it as well.
_scanned = [0]


def entries_scanned() -> int:
    """How many directory entries the walks of this module have read since the process started."""
    return _scanned[0]


def path_key(path: str) -> tuple[str, ...]:
    """The sort key of the change lists: component by component, so ``a``, ``a/x``, ``a.b``."""
    return tuple(path.split("/"))


def is_whiteout(st: os.stat_result) -> bool:
    """Whether ``st`` (an ``lstat``) is an overlay whiteout: a character device 0/0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str) -> bool:
    """Whether the directory ``path`` (in a layer) is opaque: nothing of it below shows through."""
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError as exc:
        if exc.errno in _NO_XATTR or exc.errno in _GONE:  # gone from a live upper meanwhile
            return False
        raise


def normal_path(path: str) -> str:
    """``path`` as this module takes it: relative, normalised, ``""`` for the root.

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` for an absolute path, a ``..`` or a NUL:
            no name leaves the workspace.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts or "\x00" in path:
        raise ProtocolError(
            f"path {path!r} is outside the workspace root",
            smith_pb2.ERROR_CODE_PERMISSION_DENIED,
            details={"path": path},
        )
    return "/".join(parts)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise


def _scan(path: str) -> dict[str, os.stat_result]:
    """The entries of the directory ``path``, ``lstat``-ed.

    A live upper changes while it is read (a diff against the workspace now): what vanished
    meanwhile is left out, as if read a moment later.
    """
    out: dict[str, os.stat_result] = {}
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    out[entry.name] = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
    except OSError as exc:
        if exc.errno not in _GONE:
            raise
    _scanned[0] += len(out)
    return out


def _file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _size(st: os.stat_result) -> int:
    # A directory's st_size says how the file system stores it (tmpfs and ext4 differ): not a size
    # a peer can use. A symlink's lstat size is its target's length.
    return 0 if stat.S_ISDIR(st.st_mode) else st.st_size


@dataclass(frozen=True, slots=True)
class _Found:
    """What a name is in the merged view of a chain.

    Attributes:
        path: its real path in the topmost layer that has it.
        st: that entry's ``lstat``.
        dirs: a directory: its real path in each layer whose content shows (top first, down to
            the first opaque one); empty for a non-directory.
    """

    path: str
    st: os.stat_result
    dirs: tuple[str, ...] = ()

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)


class FrozenListings:
    """The directories of frozen layers, each read once (once looked in twice): a frozen layer
    never changes, so what a request changed is told from cached listings of the layers below it,
    not one ``lstat`` and one ``getxattr`` per layer per name. Bounded: the least recently used
    directories are forgotten.

    Args:
        limit: directories kept.

    Attributes:
        bottom: the chain's last layer (its template, which may change: never cached); set for each
            walk. Every directory a walk asks about lies in one of the chain's layers, and all but
            the bottom one are frozen: a directory is cached unless it lies in the bottom one
            (one comparison, not one per layer).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.bottom = ""
        self._limit = limit
        self._dirs: collections.OrderedDict[str, dict[str, os.stat_result] | None] = collections.OrderedDict()  # None: looked in once
        self._opaque: dict[str, bool] = {}

    def covers(self, path: str) -> bool:
        """Whether directory ``path`` (in a layer of the chain being walked) is a frozen layer's."""
        bottom = self.bottom
        return not (path.startswith(bottom) and (len(path) == len(bottom) or path[len(bottom)] == "/"))

    def lstat(self, directory: str, name: str) -> os.stat_result | None:
        """``name``'s entry in the frozen ``directory``: one ``lstat`` the first time the directory
        is looked in (most are looked in once: the newest layer's, by the next request's walk),
        its listing read and kept the second time."""
        dirs = self._dirs
        if directory not in dirs:
            dirs[directory] = None
            if len(dirs) > self._limit:
                gone, _ = dirs.popitem(last=False)
                self._opaque.pop(gone, None)
            return _lstat(f"{directory}/{name}")
        entries = dirs[directory]
        if entries is None:
            entries = dirs[directory] = _scan(directory)
        dirs.move_to_end(directory)
        return entries.get(name)

    def is_opaque(self, path: str) -> bool:
        found = self._opaque.get(path)
        if found is None:
            found = self._opaque[path] = is_opaque(path)
        return found


def _child(dirs: Sequence[str], name: str, frozen: FrozenListings | None = None) -> _Found | None:
    """``name`` in the merged directory whose layers are ``dirs``, or None when nothing shows."""
    top: str | None = None
    top_st: os.stat_result | None = None
    sub: list[str] = []
    for d in dirs:
        path = f"{d}/{name}"
        cached = frozen is not None and frozen.covers(d)
        st = frozen.lstat(d, name) if cached and frozen is not None else _lstat(path)
        if st is None:
            continue
        if is_whiteout(st):
            break
        if top is None:
            top, top_st = path, st
        if not stat.S_ISDIR(st.st_mode):
            break  # a non-directory hides what is below; under a directory it is hidden itself
        sub.append(path)
        if d is dirs[-1]:
            break  # nothing below the last layer: whether it is opaque says nothing
        if frozen.is_opaque(path) if cached and frozen is not None else is_opaque(path):
            break
    if top is None or top_st is None:
        return None
    return _Found(top, top_st, tuple(sub))


def _root(chain: Sequence[str]) -> _Found:
    if not chain:
        raise ValueError("a chain has at least its template")
    return _Found(chain[0], os.lstat(chain[0]), tuple(chain))


def _resolve(chain: Sequence[str], rel: str) -> _Found | None:
    found = _root(chain)
    if rel:
        for name in rel.split("/"):
            if not found.is_dir:
                return None
            nxt = _child(found.dirs, name)
            if nxt is None:
                return None
            found = nxt
    return found


def _listing(dirs: Sequence[str]) -> dict[str, _Found]:
    """The merged directory whose layers are ``dirs`` (top first): each name that shows."""
    tops: dict[str, _Found | None] = {}  # None: whited out
    subs: dict[str, list[str]] = {}
    closed: set[str] = set()
    for d in dirs:
        for name, st in _scan(d).items():
            if name in closed:
                continue
            path = f"{d}/{name}"
            if is_whiteout(st):
                tops.setdefault(name, None)
                closed.add(name)
                continue
            if name not in tops:
                tops[name] = _Found(path, st)
                subs[name] = []
            if not stat.S_ISDIR(st.st_mode):
                closed.add(name)
                continue
            subs[name].append(path)
            if is_opaque(path):
                closed.add(name)
    out: dict[str, _Found] = {}
    for name, found in tops.items():
        if found is not None:
            out[name] = _Found(found.path, found.st, tuple(subs[name])) if found.is_dir else found
    return out


def _walk(found: _Found, rel: str) -> Iterator[tuple[str, _Found]]:
    """``found`` at ``rel`` and, a directory, everything that shows beneath it, in list order."""
    yield rel, found
    if found.is_dir:
        listing = _listing(found.dirs)
        for name in sorted(listing):
            yield from _walk(listing[name], f"{rel}/{name}" if rel else name)


def lookup(chain: Sequence[str], rel: str) -> str | None:
    """The real path of ``rel`` in the merged view of ``chain`` (top first), None if it is absent.

    Every component is looked up through the layers: a whiteout or a non-directory in a higher
    layer hides the name below it, an opaque directory stops the search at its layer.
    """
    found = _resolve(chain, normal_path(rel))
    return None if found is None else found.path


def _same_streams(a: BinaryIO, b: BinaryIO) -> bool:
    while True:
        x = a.read(_CHUNK)
        if x != b.read(_CHUNK):
            return False
        if not x:
            return True


def _same_bytes(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return _same_streams(fa, fb)
    except FileNotFoundError:  # replaced in a live upper meanwhile: not the same file
        return False


def _same(a: _Found, b: _Found) -> bool:
    """Same type, mode, size and content: a copy-up that changed nothing a peer can see."""
    if a.st.st_mode != b.st.st_mode:
        return False
    mode = a.st.st_mode
    if stat.S_ISDIR(mode):
        return True  # a directory's content is compared name by name
    if stat.S_ISREG(mode):
        return a.st.st_size == b.st.st_size and _same_bytes(a.path, b.path)
    if stat.S_ISLNK(mode):
        return os.readlink(a.path) == os.readlink(b.path)
    return a.st.st_rdev == b.st.st_rdev


class _Full(Exception):
    """The change list reached its limit."""


class _Changes:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[FileChange] = []

    def add(self, path: str, kind: ChangeKind, new: _Found | None, old: _Found | None) -> None:
        if len(self.items) >= self.limit:
            raise _Full
        shown = new if new is not None else old
        assert shown is not None
        self.items.append(
            FileChange(
                path,
                kind,
                size=0 if new is None else _size(new.st),
                old_size=0 if old is None else _size(old.st),
                file_type=_file_type(shown.st.st_mode),
            )
        )

    def deleted_tree(self, rel: str, old: _Found) -> None:
        for path, found in _walk(old, rel):
            self.add(path, "deleted", None, found)

    def added_tree(self, rel: str, new: _Found) -> None:
        for path, found in _walk(new, rel):
            self.add(path, "added", found, None)


def layer_changes(layer: str, below: Sequence[str], *, limit: int = 10_000, frozen: FrozenListings | None = None) -> ChangeSet:
    """What ``layer`` (an upper, live or frozen) changed relative to the merged view of ``below``.

    Walks the layer only: each of its names is looked up in ``below`` (the layers under it, top
    first, down to the template). A whiteout is a deletion (skipped when nothing was there), an
    opaque directory deletes what it hides, a directory present below is a change only when its
    mode differs, a file or symlink identical to the one below (a copy-up for nothing) is none.

    Args:
        layer: the upper directory.
        below: the chain under it.
        limit: at most this many changes; more: the first ``limit`` and ``truncated``.
        frozen: cached listings of the frozen layers of ``below`` (all but its last, the template;
            ``layer`` itself is not in ``below``, and is walked as it is).

    Returns:
        The changes, sorted by :func:`path_key`.
    """
    out = _Changes(limit)
    truncated = False
    if frozen is not None:
        frozen.bottom = below[-1] if below else ""  # the template, at the bottom, may change: read it as it is
    try:
        _layer_dir(layer, "", _Dirs(list(below)), False, out, frozen)
    except _Full:
        truncated = True
    return ChangeSet(changes=tuple(out.items), truncated=truncated)


class _Dirs:
    """The layers' directories of one merged directory (top first), found only as far as a lookup
    needs them: a name a request wrote is mostly in the layer right under its upper, and then the
    deeper layers (the template's directory, whether each is opaque) are never looked at."""

    __slots__ = ("_found", "_more")

    def __init__(self, found: list[str], more: Iterator[str] | None = None) -> None:
        self._found = found
        self._more = more

    def get(self, i: int) -> str | None:
        """The ``i``-th directory (0: the top), None past the last."""
        found = self._found
        while len(found) <= i and self._more is not None:
            nxt = next(self._more, None)
            if nxt is None:
                self._more = None
                break
            found.append(nxt)
        return found[i] if i < len(found) else None

    def all(self) -> tuple[str, ...]:
        while self._more is not None:
            self.get(len(self._found))
        return tuple(self._found)


def _lookup(d: str, name: str, frozen: FrozenListings | None) -> os.stat_result | None:
    if frozen is not None and frozen.covers(d):
        return frozen.lstat(d, name)
    return _lstat(f"{d}/{name}")


def _opaque(path: str, d: str, frozen: FrozenListings | None) -> bool:
    if frozen is not None and frozen.covers(d):
        return frozen.is_opaque(path)
    return is_opaque(path)


def _deeper(dirs: _Dirs, i: int, path: str, name: str, frozen: FrozenListings | None) -> Iterator[str]:
    """``name``'s directories in the layers under ``dirs``' ``i``-th, where it is the directory
    ``path``: as :func:`_child` collects them (down to the first opaque one, a whiteout or a
    non-directory), one at a time."""
    while dirs.get(i + 1) is not None and not _opaque(path, dirs.get(i) or "", frozen):  # the last layer: nothing below
        i += 1
        while True:
            d = dirs.get(i)
            if d is None:
                return
            st = _lookup(d, name, frozen)
            if st is None:
                i += 1
                continue
            if is_whiteout(st) or not stat.S_ISDIR(st.st_mode):
                return
            path = f"{d}/{name}"
            yield path
            break


def _child_below(dirs: _Dirs, name: str, frozen: FrozenListings | None) -> tuple[_Found, _Dirs] | None:
    """:func:`_child` over lazily found directories: ``name``'s entry in the merged directory, and
    (a directory) its own directories, found as far as they are asked for; None when nothing shows."""
    i = 0
    while (d := dirs.get(i)) is not None:
        st = _lookup(d, name, frozen)
        if st is None:
            i += 1
            continue
        if is_whiteout(st):
            return None
        path = f"{d}/{name}"
        if not stat.S_ISDIR(st.st_mode):
            return _Found(path, st), _Dirs([])
        return _Found(path, st), _Dirs([path], _deeper(dirs, i, path, name, frozen))
    return None


def _layer_dir(upper: str, prefix: str, below: _Dirs, replaced: bool, out: _Changes,
               frozen: FrozenListings | None = None) -> None:
    """The changes in the layer's directory ``upper`` (``prefix``: its path and a slash).

    ``below``: the layers of the same directory beneath; ``replaced``: the directory shows only
    this layer's content (it or an ancestor is opaque), so whatever is below and not here is gone.
    """
    mine = _scan(upper)
    theirs = _listing(below.all()) if replaced else None
    names = sorted(mine.keys() | theirs.keys()) if theirs is not None else sorted(mine)
    for name in names:
        rel = prefix + name
        lazy: _Dirs | None = None
        if theirs is not None:
            old = theirs.get(name)
        else:
            hit = _child_below(below, name, frozen)
            old, lazy = hit if hit is not None else (None, None)
            if old is not None and lazy is not None and old.is_dir:
                old = _Found(old.path, old.st, ())  # its directories: ``lazy`` (all of them where a listing needs them)
        st = mine.get(name)
        if st is None:  # only below, under an opaque directory
            assert old is not None
            out.deleted_tree(rel, old)
            continue
        if is_whiteout(st):
            if old is not None:
                out.deleted_tree(rel, old if lazy is None else _Found(old.path, old.st, lazy.all()))
            continue
        new = _Found(f"{upper}/{name}", st)
        if stat.S_ISDIR(st.st_mode):
            if old is None or not old.is_dir:
                out.add(rel, "added" if old is None else "modified", new, old)
                _layer_dir(new.path, rel + "/", _Dirs([]), False, out, frozen)
            else:
                if old.st.st_mode != st.st_mode:
                    out.add(rel, "modified", new, old)
                dirs = lazy if lazy is not None else _Dirs(list(old.dirs))
                _layer_dir(new.path, rel + "/", dirs, replaced or is_opaque(new.path), out, frozen)
        elif old is None:
            out.add(rel, "added", new, None)
        elif old.is_dir:
            # a file where a directory was: the directory's content went with it
            out.add(rel, "modified", new, old)
            listing = _listing(lazy.all() if lazy is not None else old.dirs)
            for child in sorted(listing):
                out.deleted_tree(f"{rel}/{child}", listing[child])
        elif not _same(new, old):
            out.add(rel, "modified", new, old)


class _Filter:
    """``diff``'s ``paths``: which names are wanted, and which directories lead to them."""

    def __init__(self, paths: Sequence[str]) -> None:
        normal = {normal_path(p) for p in paths}
        self.all = not normal or "" in normal
        self.paths = tuple(sorted(normal))

    def wants(self, rel: str) -> bool:
        return self.all or any(rel == p or rel.startswith(p + "/") for p in self.paths)

    def leads(self, rel: str) -> bool:
        """``rel`` is wanted or is a directory above a wanted path (so it must be walked)."""
        return self.all or any(rel == p or rel.startswith(p + "/") or p.startswith(rel + "/") for p in self.paths)


def _common_suffix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    while n < len(a) and n < len(b) and os.path.normpath(a[-1 - n]) == os.path.normpath(b[-1 - n]):
        n += 1
    return n


def _collect(layer_dir: str, prefix: str, want: _Filter, found: set[str], opaque: set[str]) -> None:
    """The names of a layer's directory (and beneath) that ``want`` keeps; its opaque directories."""
    for name, st in _scan(layer_dir).items():
        rel = prefix + name
        if not want.leads(rel):
            continue
        if want.wants(rel):
            found.add(rel)
        if stat.S_ISDIR(st.st_mode):
            path = f"{layer_dir}/{name}"
            if is_opaque(path):
                opaque.add(rel)
            _collect(path, rel + "/", want, found, opaque)


def _under(rel: str, marks: set[str]) -> bool:
    """``rel`` or one of its ancestors is in ``marks``."""
    if not marks:
        return False
    while True:
        if rel in marks:
            return True
        if "/" not in rel:
            return False
        rel = rel.rpartition("/")[0]


def diff(
    a: Sequence[str],
    b: Sequence[str],
    *,
    max_diff_bytes: int,
    paths: Sequence[str] = (),
    limit: int = 10_000,
) -> ChangeSet:
    """What differs from chain ``a`` to chain ``b`` (each top first, down to its template).

    Only the layers that are not in the chains' common bottom suffix (the same template, the same
    frozen layers) are walked for candidate names; each candidate is looked up in both chains and
    classified as :func:`layer_changes` does. Where a layer hides what is below (an opaque
    directory, a whiteout or a file over a directory) the hidden tree is listed too.

    Args:
        a: the chain before.
        b: the chain after.
        max_diff_bytes: unified diffs (``a/PATH`` ``b/PATH``) for text files (UTF-8, no NUL) up
            to this many bytes in all; a file larger than that gets none. Past it: ``truncated``.
        paths: only what is at or beneath one of these (all when empty).
        limit: at most this many changes; more: the first ``limit`` and ``truncated``.

    Returns:
        The changes, sorted by :func:`path_key`.

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` for a path of ``paths`` that leaves the
            workspace (absolute, ``..``).
    """
    want = _Filter(paths)
    shared = _common_suffix(a, b)
    candidates: set[str] = set(want.paths) - {""}
    opaque: set[str] = set()
    for layer in (*a[: len(a) - shared], *b[: len(b) - shared]):
        _collect(layer, "", want, candidates, opaque)
    truncated = False
    seen: dict[str, tuple[_Found | None, _Found | None]] = {}
    expanded: set[str] = set()
    pending = candidates
    while pending:
        more: set[str] = set()
        for rel in sorted(pending, key=path_key):  # parents first: their listing covers the rest
            old, new = seen[rel] = (_resolve(a, rel), _resolve(b, rel))
            old_dir = old is not None and old.is_dir
            new_dir = new is not None and new.is_dir
            # A directory on one side only, or whose content one side hides: all beneath differs.
            if (old_dir != new_dir or (old_dir and new_dir and _under(rel, opaque))) and not _under(rel, expanded):
                expanded.add(rel)
                for side in (old, new):
                    if side is not None and side.is_dir:
                        truncated |= _subtree(side, rel, limit, seen, more)
        pending = more
    changes = _Changes(limit)
    pairs: list[tuple[_Found | None, _Found | None]] = []
    try:
        for rel in sorted(seen, key=path_key):
            old, new = seen[rel]
            if old is None and new is None:
                continue
            if old is None:
                changes.add(rel, "added", new, None)
            elif new is None:
                changes.add(rel, "deleted", None, old)
            elif _same(old, new):
                continue
            else:
                changes.add(rel, "modified", new, old)
            pairs.append((old, new))
    except _Full:
        truncated = True
    items, cut = _with_diffs(changes.items, pairs, max_diff_bytes)
    return ChangeSet(changes=tuple(items), truncated=truncated or cut)


def _subtree(
    top: _Found,
    rel: str,
    limit: int,
    seen: dict[str, tuple[_Found | None, _Found | None]],
    more: set[str],
) -> bool:
    """Add the names beneath the directory ``top`` (at ``rel``) not yet seen to ``more``, at most
    ``limit`` + 1 of them (a cut listing, which the sorted list still begins with): whether cut."""
    count = 0
    walk = _walk(top, rel)
    next(walk)  # the directory itself
    for path, _ in walk:
        count += 1
        if count > limit:
            return True
        if path not in seen:
            more.add(path)
    return False


def _text(found: _Found | None, cap: int) -> tuple[str | None, bool]:
    """A regular file's content as text: ``(text, too_big)``; None when not a text file."""
    if found is None:
        return "", False
    if not stat.S_ISREG(found.st.st_mode):
        return None, False
    if found.st.st_size > cap:
        with open(found.path, "rb") as f:
            head = f.read(_SNIFF)
        return None, b"\x00" not in head  # binary: no diff to miss
    with open(found.path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:  # grew since the stat (a live upper)
        return None, True
    if b"\x00" in data:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return None, False


def _unified(old: str, new: str, path: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    # difflib leaves a last line without its newline joined to the next one: mark it as git does
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _with_diffs(
    items: list[FileChange], pairs: list[tuple[_Found | None, _Found | None]], budget: int
) -> tuple[list[FileChange], bool]:
    """``items`` with unified diffs for their text files, ``budget`` bytes in all: whether cut."""
    if budget <= 0:
        return items, False
    out: list[FileChange] = []
    used = 0
    cut = skipped = False
    for change, (old, new) in zip(items, pairs):
        if cut or change.file_type != "file":
            out.append(change)
            continue
        before, big_a = _text(old, budget)
        after, big_b = _text(new, budget)
        if big_a or big_b:
            skipped = True  # a text file too big to diff: the diffs are not all there
            out.append(change)
            continue
        if before is None or after is None:
            out.append(change)
            continue
        text = _unified(before, after, change.path)
        size = len(text.encode("utf-8", "surrogateescape"))
        if used + size > budget:
            cut = True
            out.append(change)
            continue
        used += size
        out.append(
            FileChange(change.path, change.kind, change.size, change.old_size, change.file_type, unified_diff=text)
        )
    return out, cut or skipped


def merge(lower: str, upper: str, out: str) -> None:
    """Make ``out`` (which must not exist) the layer ``upper`` stacked on ``lower`` is.

    Both are frozen layers on the file system ``out`` goes to. Directories are created fresh
    (mode, times, ``user.*`` xattrs, opacity), files, symlinks and whiteouts are hard links: no
    data is read or copied. Upper wins name by name; an upper whiteout is kept (it must still hide
    what is further below), an upper opaque directory drops the lower one's content, and an upper
    directory over a lower non-directory or whiteout becomes opaque (the lower one hid the rest).

    Raises:
        FileExistsError: ``out`` exists.
    """
    _merge_dir(lower, upper, out, opaque=is_opaque(upper))


def _merge_dir(lower: str | None, upper: str | None, out: str, *, opaque: bool) -> None:
    os.mkdir(out, 0o700)
    mine = _scan(upper) if upper is not None else {}
    theirs = _scan(lower) if lower is not None else {}
    if upper is not None and is_opaque(upper):
        theirs = {}
    for name in mine.keys() | theirs.keys():
        u, lo = mine.get(name), theirs.get(name)
        target = f"{out}/{name}"
        if u is not None:
            src = f"{upper}/{name}"
            if not stat.S_ISDIR(u.st_mode):
                os.link(src, target, follow_symlinks=False)
            elif lo is not None and stat.S_ISDIR(lo.st_mode):
                below = f"{lower}/{name}"
                _merge_dir(None if is_opaque(src) else below, src, target, opaque=is_opaque(src) or is_opaque(below))
            else:
                # nothing of the name in lower: the upper directory as it is; a lower file or
                # whiteout hid what is further below, and the directory must go on hiding it
                _merge_dir(None, src, target, opaque=lo is not None or is_opaque(src))
        else:
            assert lo is not None
            src = f"{lower}/{name}"
            if stat.S_ISDIR(lo.st_mode):
                _merge_dir(None, src, target, opaque=is_opaque(src))
            else:
                os.link(src, target, follow_symlinks=False)
    _copy_dir_meta(upper if upper is not None else lower, out, opaque)


def _copy_dir_meta(src: str | None, out: str, opaque: bool) -> None:
    assert src is not None
    st = os.lstat(src)
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_XATTR:
            raise
        names = []
    for name in names:
        if name.startswith("user.") and name != OPAQUE_XATTR:
            os.setxattr(out, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)
    if opaque:
        os.setxattr(out, OPAQUE_XATTR, b"y", follow_symlinks=False)
    # last: the entries made above changed the times, and the mode may forbid writing
    os.chmod(out, stat.S_IMODE(st.st_mode))
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def restore_paths(target_root: str, paths: Sequence[str], before: Sequence[str]) -> ChangeSet:
    """Put each of ``paths`` in the live view mounted at ``target_root`` back as chain ``before`` has it.

    Written through the mount with ordinary file operations, every one relative to a directory
    opened beneath ``target_root`` without following any symlink (a symlink a command left on the
    way is refused, never followed out). Absent in ``before``: removed (a directory with its
    tree); a file: its bytes, mode and times (a new file renamed over the name); a symlink:
    recreated; a directory: made with its mode (its content is the caller's list, parents first).
    A missing parent directory is restored first. Each path on its own: hard links are not kept.

    Returns:
        What it changed, sorted by :func:`path_key` (``added``: it had to be made again).

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` for a path that leaves the workspace.
        OSError: a symlink on the way (``ELOOP``), the workspace full (``ENOSPC``) …
    """
    root = os.open(target_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        out = _Changes(1 << 62)
        done: set[str] = set()
        modes: dict[str, int] = {}
        for path in paths:
            rel = normal_path(path)
            if rel:
                _restore(root, rel, before, out, done, modes)
        # Directory modes last, deepest first: one without write permission (0o555) is still
        # filled above, as the service holds no capability that would bypass the mode.
        for rel in sorted(modes, key=path_key, reverse=True):
            parent, _, name = rel.rpartition("/")
            dirfd = _open_dir(root, parent)
            try:
                os.chmod(name, modes[rel], dir_fd=dirfd, follow_symlinks=False)
            finally:
                os.close(dirfd)
        items = sorted(out.items, key=lambda c: path_key(c.path))
        return ChangeSet(changes=tuple(items))
    finally:
        os.close(root)


def _open_dir(root: int, rel: str) -> int:
    return open_beneath(root, rel or ".", os.O_PATH | os.O_DIRECTORY, follow=False)


def _restore(root: int, rel: str, before: Sequence[str], out: _Changes, done: set[str], modes: dict[str, int]) -> None:
    if rel in done:
        return
    done.add(rel)
    want = _resolve(before, rel)
    parent, _, name = rel.rpartition("/")
    try:
        dirfd = _open_dir(root, parent)
    except OSError as exc:
        if exc.errno not in _GONE:
            raise
        if want is None:
            return  # no parent directory: the name is absent already
        _restore(root, parent, before, out, done, modes)
        dirfd = _open_dir(root, parent)
    try:
        _restore_at(dirfd, name, rel, want, out, modes)
    finally:
        os.close(dirfd)


def _fd_found(dirfd: int, name: str) -> _Found | None:
    """The entry ``name`` of ``dirfd`` (its ``path``: the name, relative to ``dirfd``)."""
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise
    return _Found(name, st)


def _same_at(dirfd: int, name: str, now: _Found, want: _Found) -> bool:
    if now.st.st_mode != want.st.st_mode:
        return False
    mode = now.st.st_mode
    if stat.S_ISDIR(mode):
        return True
    if stat.S_ISLNK(mode):
        return os.readlink(name, dir_fd=dirfd) == os.readlink(want.path)
    if stat.S_ISREG(mode):
        if now.st.st_size != want.st.st_size:
            return False
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        with os.fdopen(fd, "rb") as mine, open(want.path, "rb") as theirs:
            return _same_streams(mine, theirs)
    return now.st.st_rdev == want.st.st_rdev


def _remove(dirfd: int, name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        # rmtree with dir_fd walks by fds and never follows a symlink
        shutil.rmtree(name, dir_fd=dirfd)
    else:
        os.unlink(name, dir_fd=dirfd)


def _restore_at(dirfd: int, name: str, rel: str, want: _Found | None, out: _Changes, modes: dict[str, int]) -> None:
    now = _fd_found(dirfd, name)
    if want is None:
        if now is not None:
            _remove(dirfd, name, now.st)
            out.add(rel, "deleted", None, now)
        return
    if now is not None and _same_at(dirfd, name, now, want):
        return
    mode = want.st.st_mode
    if stat.S_ISDIR(mode):
        if now is not None and not now.is_dir:
            _remove(dirfd, name, now.st)
        if now is None or not now.is_dir:
            os.mkdir(name, 0o700, dir_fd=dirfd)
        modes[rel] = stat.S_IMODE(mode)
    else:
        if now is not None and now.is_dir:
            _remove(dirfd, name, now.st)
        _replace(dirfd, name, want)
    out.add(rel, "added" if now is None else "modified", want, now)


def _replace(dirfd: int, name: str, want: _Found) -> None:
    """A new entry like ``want`` made under a temporary name, renamed over ``name``."""
    tmp = f".smith-restore-{os.getpid()}-{secrets.token_hex(4)}"
    mode = want.st.st_mode
    try:
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(want.path), tmp, dir_fd=dirfd)
        elif stat.S_ISREG(mode):
            _copy_file(want, dirfd, tmp)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(tmp, stat.S_IMODE(mode), dir_fd=dirfd)
        else:
            os.mknod(tmp, mode, want.st.st_rdev, dir_fd=dirfd)
        if not stat.S_ISLNK(mode):
            os.chmod(tmp, stat.S_IMODE(mode), dir_fd=dirfd, follow_symlinks=False)
        os.utime(tmp, ns=(want.st.st_atime_ns, want.st.st_mtime_ns), dir_fd=dirfd, follow_symlinks=False)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except OSError:
            pass
        raise


def _copy_file(want: _Found, dirfd: int, tmp: str) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    try:
        with open(want.path, "rb", buffering=0) as src:
            while chunk := src.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        os.close(fd)

