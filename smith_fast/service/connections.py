"""The service's live network connections, whichever front carries them, against ``--max-connections``.

Every front (the socket :class:`~smith_fast.service.connection.Connection`, a gRPC ``Stream``
call, an MCP HTTP connection) hands its connection to the one :class:`ConnectionGate` the server
made when it arrives and when it ends; the gate counts them, so the limit is the same number for
all of them and no front keeps a count of its own. A connection over the limit may wait a moment
to be told so in its own protocol (the socket front reads its first two bytes for that): at most
``max_waiting`` of them at once.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["ConnectionGate"]


class ConnectionGate:
    """Counts live network connections against a limit.

    Args:
        limit: ``--max-connections``.
        max_waiting: over-limit connections that may wait at once to be refused in their protocol.
    """

    def __init__(self, limit: int, *, max_waiting: int = 64) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self._live: set[Hashable] = set()
        self._waiting: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._live)

    def admit(self, conn: Hashable) -> bool:
        """Count ``conn`` in; False (and not counted) when the limit is reached."""
        if conn in self._live:
            return True
        if len(self._live) >= self.limit:
            return False
        self._live.add(conn)
        return True

    def release(self, conn: Hashable) -> None:
        """``conn`` ended (or was refused): no longer counted. Releasing twice is harmless."""
        self._live.discard(conn)
        self._waiting.discard(conn)

    def wait(self, conn: Hashable) -> bool:
        """Let an over-limit ``conn`` wait to be told so; False when ``max_waiting`` already do."""
        if len(self._waiting) >= self.max_waiting:
            return False
        self._waiting.add(conn)
        return True

    def waited(self, conn: Hashable) -> None:
        """``conn`` was told (or went away): it no longer waits."""
        self._waiting.discard(conn)
