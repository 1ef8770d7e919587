"""The process slots a request takes: the service's (``--max-processes``) and its session's share.

Every way a peer's process starts (a ``ShellExec``, a background one, a tool's or a plan step's
process: :mod:`~smith_fast.service.shell_exec`, :mod:`~smith_fast.service.background`,
:mod:`~smith_fast.service.launch`) takes one slot here first and gives it back through what
:func:`take` returns. The service's slots alone let one session hold all of them (64 ``sleep``
commands), and every other session's commands were refused until they ended; a session may hold
``--max-processes-per-session`` of them at once. A background process keeps its session's count
while it runs, after its session ended too (it outlives it; the count then reaches no one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from .config import Limits

__all__ = ["SessionSlots", "SlotCore", "take"]


class SlotCore(Protocol):
    """The service's slots (:class:`~smith_fast.service.core.ServiceCore`)."""

    @property
    def limits(self) -> Limits: ...

    def acquire_process(self) -> bool: ...

    def release_process(self) -> None: ...


class SessionSlots:
    """The slots one session holds (its processes running now)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


def take(core: SlotCore, slots: SessionSlots, rid: str) -> Callable[[], None]:
    """One slot of the service's and of ``slots``' session, for request ``rid``: the function that
    gives both back (once; a second call does nothing).

    Raises:
        ProtocolError: ``RESOURCE_EXHAUSTED`` when the session holds its share or the service every slot.
    """
    limits = core.limits
    if slots.held >= limits.max_session_processes:
        raise ProtocolError(f"this session runs {slots.held} commands, its most (--max-processes-per-session); "
                            "try again when one ended", pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid)
    if not core.acquire_process():
        raise ProtocolError(f"too many commands running (max {limits.max_processes}); try again later",
                            pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid)
    slots.held += 1
    holding = True

    def release() -> None:
        nonlocal holding
        if holding:
            holding = False
            slots.held -= 1
            core.release_process()

    return release
