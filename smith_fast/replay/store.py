"""Where a service keeps its session recordings: one private directory, bounded in size.

* **Private**: the directory is made with mode 0700 (and its recordings 0600); one that exists and
  lets other users in (any group or other permission bit) is refused at start-up, with the
  ``chmod`` that fixes it, since recordings hold everything sessions sent and received. The
  default is ``recordings/`` in the service's state directory (``--state-dir``), out of the
  workspace.
* **Bounded**: the recordings in the directory hold at most ``--record-max-bytes`` together.
  Before a write would pass it, the oldest finished recordings are removed (rotation: those of
  earlier runs count too); a recording that cannot fit even then (the running ones alone fill the
  bound) stops, with the warning a write failure gives, and its session goes on.
"""

from __future__ import annotations

import collections
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path


from ..logs import get_logger
from .format import FILE_SUFFIX
from .writer import SessionRecorder

__all__ = ["RecordingStore"]

log = get_logger("smith_fast.replay")


class RecordingStore:
    """The recordings directory of one service and its size bound.

    Args:
        directory: where recordings go.
        max_bytes: the most their files may hold together (``--record-max-bytes``); 0: no bound.
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.total = 0  # bytes of the recordings in the directory (written by this process or found)
        self.removed = 0  # recordings removed to make room
        self._files: collections.deque[Path] = collections.deque()  # oldest first
        self._live: dict[Path, SessionRecorder] = {}
        self._scanned = False

    def check(self) -> None:
        """Make the directory (0700) if it is missing; refuse one other users may enter.

        Raises:
            OSError: it cannot be made.
            ValueError: it exists with group or other permissions (the message says the fix).
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(self.directory.stat().st_mode)
        if mode & 0o077:
            raise ValueError(
                f"the recordings directory {self.directory} is open to other users (mode {mode:04o}); recordings hold "
                f"everything sessions send and receive: chmod 700 {self.directory}, or record elsewhere"
            )

    def open(self, *, session_id: str, protocol_version: int, service_id: str,
             on_error: Callable[[str], None] | None = None, metadata: Mapping[str, object] | None = None) -> SessionRecorder:
        """A new recording in the directory, its writes counted against the bound.

        Raises:
            OSError: the file cannot be made, or there is no room for it.
        """
        self._scan()
        self._live = {path: r for path, r in self._live.items() if r.active}  # the finished ones are files like any
        recorder = SessionRecorder.open(
            self.directory, session_id=session_id, protocol_version=protocol_version, service_id=service_id,
            on_error=on_error, metadata=metadata, limit=self._charge,
        )
        if self.max_bytes:  # without a bound nothing is ever removed: no need to remember the order
            self._files.append(recorder.path)
        self._live[recorder.path] = recorder
        return recorder

    def _scan(self) -> None:
        """Count the recordings already there (an earlier run's), once, oldest first (names sort by start)."""
        if self._scanned:
            return
        self._scanned = True
        if not self.max_bytes:
            return
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(FILE_SUFFIX))
        except OSError:
            return
        for name in names:
            path = self.directory / name
            try:
                self.total += path.stat().st_size
            except OSError:
                continue
            self._files.append(path)

    def _charge(self, size: int) -> bool:
        """May ``size`` bytes more be written? Removes the oldest finished recordings to make room."""
        self.total += size
        if not self.max_bytes or self.total <= self.max_bytes:
            return True
        self._rotate()
        if self.total <= self.max_bytes:
            return True
        self.total -= size
        return False

    def _rotate(self) -> None:
        kept: list[Path] = []
        while self._files and self.total > self.max_bytes:
            path = self._files.popleft()
            recorder = self._live.get(path)
            if recorder is not None and recorder.active:
                kept.append(path)  # still being written: only finished ones go
                continue
            self._live.pop(path, None)
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                continue
            self.total -= size
            self.removed += 1
            log.info("recording removed", extra={"fields": {"path": str(path), "bytes": size, "reason": "--record-max-bytes"}})
        self._files.extendleft(reversed(kept))
