"""Build- and run-time switches, read once, and the modules compiled where they lie.

``SMITH_FAST_NO_EXTENSIONS=1`` (any value but empty or ``0``) makes every facade pick its
pure-Python twin even where the compiled one is installed, and makes the modules of
:data:`COMPILED_IN_PLACE` load from their ``.py``.

:data:`COMPILED_IN_PLACE` is the per-request path of a call (the session's admission, the runner,
the tool registry, the fs tools, the sink, the audit line): ordinary modules that ``setup.py``
also compiles unchanged with Cython, each into an extension of the same name beside its ``.py``
(one source, as aiohttp compiles its ``reader_py.py``). Python's import prefers the extension;
:class:`SourceFirst` (on ``sys.meta_path`` from the first ``import smith_fast``) hands out the
``.py`` instead when extensions are turned off, or when the ``.py`` is not the one its extension
was built from (an edit or a checkout without ``make install``; the build writes the CRC-32 of
each source it compiled in :data:`SUMS`): a stale build never runs code other than its source
says. File times alone would not do: pip unpacks a wheel's ``.py`` after its ``.so``. They serve
as a shortcut: the build also notes each source's size and mtime (ns), and a source that still has
both is the one it compiled; only one that differs is read and summed (every start summed all
eighteen, ~0.5 ms; an installed wheel's sources, unpacked later, are summed as before).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from types import ModuleType

__all__ = ["COMPILED_IN_PLACE", "NO_EXTENSIONS", "SUMS", "SourceFirst", "compiled", "source_stamp", "source_sum"]

NO_EXTENSIONS: bool = os.environ.get("SMITH_FAST_NO_EXTENSIONS", "") not in ("", "0")

COMPILED_IN_PLACE: frozenset[str] = frozenset({
    "smith_fast.containment",
    "smith_fast.fd_watch",
    "smith_fast.logs",
    "smith_fast.process_spawn",
    "smith_fast.sandbox.zygote",
    "smith_fast.service.admission",
    "smith_fast.service.audit",
    "smith_fast.service.commands",
    "smith_fast.service.connection",
    "smith_fast.service.flow",
    "smith_fast.service.launch",
    "smith_fast.service.metrics",
    "smith_fast.service.request",
    "smith_fast.service.request_start",
    "smith_fast.service.request_table",
    "smith_fast.service.runner",
    "smith_fast.service.session",
    "smith_fast.service.shell_exec",
    "smith_fast.service.sizes",
    "smith_fast.service.sinks",
    "smith_fast.service.spawn",
    "smith_fast.shell_process",
    "smith_fast.tools.fs",
    "smith_fast.tools.openat2",
    "smith_fast.tools.registry",
    "smith_fast.tools.schema",
    "smith_fast.tools.workspace",
})
"""The modules ``setup.py`` compiles where they lie (their names, as imported)."""


SUMS = "_in_place.sums"
"""The file beside this one where the build notes, a line per module it compiled in place, the
module's name, the CRC-32 of the source it compiled (hexadecimal) and that source's
:func:`source_stamp` (a line without one: the CRC decides)."""


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` runs compiled (an extension), not from its ``.py``."""
    return (module.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def source_sum(path: str) -> str:
    """The CRC-32 of file ``path``, as :data:`SUMS` notes it."""
    import zlib  # here: what a start-up without compiled modules need not load

    with open(path, "rb") as f:
        return f"{zlib.crc32(f.read()):08x}"


def source_stamp(path: str) -> str:
    """The size and modification time (ns) of file ``path``, as :data:`SUMS` notes them."""
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


class SourceFirst:
    """A meta path finder: a module of :data:`COMPILED_IN_PLACE` from its ``.py`` when extensions
    are off or its extension was not built from that ``.py``; otherwise it leaves the module to
    the usual finders (which take the extension)."""

    built: dict[str, list[str]] | None = None  # SUMS, read on first use: name → [crc, stamp]

    @classmethod
    def find_spec(cls, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in COMPILED_IN_PLACE or not path:
            return None
        source = os.path.join(path[0], fullname.rpartition(".")[2] + ".py")
        if not NO_EXTENSIONS:
            built = cls.sums().get(fullname)
            try:
                if built is not None and (built[1:] == [source_stamp(source)] or source_sum(source) == built[0]):
                    return None  # built from this source: the extension
            except OSError:
                return None  # no source to prefer
        import importlib.util  # here: only a module run from its source needs it

        return importlib.util.spec_from_file_location(fullname, source)

    @classmethod
    def sums(cls) -> dict[str, list[str]]:
        if cls.built is None:
            try:
                with open(os.path.join(os.path.dirname(__file__), SUMS)) as f:
                    cls.built = {name: noted for name, *noted in map(str.split, f) if noted}
            except (OSError, ValueError):
                cls.built = {}  # nothing built in place (or unreadable): every module from its source
        return cls.built


if not any(finder is SourceFirst for finder in sys.meta_path):
    sys.meta_path.insert(0, SourceFirst)
