"""smith-fast: a fast backend for the Smith tool-execution protocol, and its client.

What a user needs is here::

    import smith_fast

    async with await smith_fast.Client.connect("unix:/run/smith.sock") as client:
        await client.handshake(["shell_exec"])
        result = await client.run("uname -a")      # RunResult(exit_code, stdout, stderr)

- :class:`Client` (a Unix or TCP socket, v1 frames or v0 lines) and :class:`GrpcClient`, with the
  client's errors (:class:`SmithError` for an ``ErrorEvent``, :class:`ConnectionClosed`,
  :class:`ConnectError`, :class:`NotASmithService`, :class:`AddressError`);
- every exception of the package: :class:`SmithFastError` and its hierarchy
  (:mod:`smith_fast.errors`);
- :data:`__version__`.

The client is imported on first use (``smith_fast.Client``): it brings asyncio and protobuf, some
70 ms, which ``import smith_fast.framing`` and the other modules need not pay. The service itself
is started by the ``smith-fast`` command (:mod:`smith_fast.cli`).
"""

from __future__ import annotations

from . import _compat  # noqa: F401  # first: it chooses how the modules compiled in place load
from ._version import __version__
from .errors import (
    AddressError,
    ArgumentError,
    ConnectError,
    ConnectionClosed,
    EgressError,
    EgressRuleError,
    EncodeError,
    FrameTooLarge,
    FramingError,
    HeadError,
    HookFailure,
    HttpError,
    HttpRefused,
    HookLoadError,
    LandlockError,
    MountError,
    ListenError,
    LogFormatError,
    NatsCredentialError,
    NotASmithService,
    PlanError,
    ProtocolError,
    ResumeRefused,
    SandboxError,
    SandboxUnavailable,
    SmithError,
    SmithFastError,
    StartupError,
    UnsafeRoot,
    ZygoteGone,
    WorkspacesUnavailable,
)

# Not typing.TYPE_CHECKING: importing typing would cost `import smith_fast` more than the rest of it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .client import Change, Client, GrpcClient, UndoResult

__all__ = [
    "__version__",
    # the client (imported on first use) and its errors (errors.py, imported now)
    "Client",
    "GrpcClient",
    "SmithError",
    "ConnectionClosed",
    "ConnectError",
    "NotASmithService",
    "AddressError",
    # what a session's workspace changed (client_workspace.py; imported with the client)
    "Change",
    "UndoResult",
    # the errors
    "SmithFastError",
    "FramingError",
    "FrameTooLarge",
    "EncodeError",
    "ProtocolError",
    "PlanError",
    "ResumeRefused",
    "ArgumentError",
    "HookLoadError",
    "HookFailure",
    "LogFormatError",
    "SandboxError",
    "SandboxUnavailable",
    "UnsafeRoot",
    "ZygoteGone",
    "LandlockError",
    "WorkspacesUnavailable",
    "MountError",
    "EgressError",
    "EgressRuleError",
    "ListenError",
    "StartupError",
    "HttpRefused",
    "HeadError",
    "HttpError",
    "NatsCredentialError",
]

_FROM_CLIENT = frozenset({"Client", "GrpcClient", "Change", "UndoResult"})


def __getattr__(name: str) -> object:
    if name not in _FROM_CLIENT:
        raise AttributeError(f"module 'smith_fast' has no attribute {name!r}")
    from . import client

    value = getattr(client, name)
    globals()[name] = value  # once: the next look-up is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
