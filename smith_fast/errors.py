"""The exceptions smith-fast raises: one small hierarchy under :class:`SmithFastError`, all here.

::

    SmithFastError
    ├── FramingError (ValueError) ── FrameTooLarge     the byte stream (both twins, same messages)
    ├── EncodeError (ValueError)                       a value the wire cannot carry
    ├── ProtocolError ── PlanError, ResumeRefused      a peer broke the protocol (has an ErrorCode)
    ├── ArgumentError (ValueError)                     a tool call's arguments
    ├── HookLoadError, HookFailure                     a hook that does not load, a call that failed
    ├── LogFormatError (ValueError)                    a file that is not a session log
    ├── SandboxError                                   the sandbox of the processes started for peers
    │   ├── SandboxUnavailable ── UnsafeRoot           ... cannot be had: the service refuses to start
    │   │   └── WorkspacesUnavailable                  ... nor the workspaces' namespace and overlays
    │   ├── LandlockError (OSError)                    ... a process could not be confined
    │   └── MountError (OSError)                       ... the mount host refused or failed a mount
    ├── EgressError                                    the egress proxy (--network allow)
    │   └── EgressRuleError (ValueError)               ... an --egress-* option it cannot use
    ├── ListenError, StartupError                      the service cannot start as configured
    ├── SmithError                                     the client: the service answered with an ErrorEvent
    ├── ConnectionClosed ── ConnectError (OSError)     the client: the connection ended, or never was
    │                       └── NotASmithService       ... something else answers at the address
    ├── AddressError (ValueError)                      the client: an address of no known form
    ├── NatsCredentialError (ValueError)               a NATS key file that cannot be written or used
    └── (the HTTP fronts')

A module that raises one of these imports it from here; the modules that first defined them still
export them under the same name. Exceptions that never leave their module stay private there.
Both twins of every wire-core module raise these exact classes with the exact same messages, so
callers can catch them without knowing which implementation is active.
"""

from __future__ import annotations

from collections.abc import Mapping

# Not typing.TYPE_CHECKING: `import smith_fast` imports this module and need not pay for typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .pb import smith_pb2 as pb

__all__ = [
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
    "ZygoteGone",
    "UnsafeRoot",
    "LandlockError",
    "WorkspacesUnavailable",
    "MountError",
    "EgressError",
    "EgressRuleError",
    "ListenError",
    "StartupError",
    # client and NATS
    "SmithError",
    "ConnectionClosed",
    "ConnectError",
    "NotASmithService",
    "AddressError",
    "NatsCredentialError",
]


class SmithFastError(Exception):
    """Base class of every error smith-fast raises on purpose."""


class FramingError(SmithFastError, ValueError):
    """The byte stream is not a valid sequence of varint-delimited frames.

    A decoder's ``feed`` raises it after decoding what it could of the data it was given: those
    frames are not lost, they travel on the exception.

    Attributes:
        offset: byte offset in the stream (counted from the first byte ever fed) of the start of
            the frame whose length prefix is bad.
        frames: the frames completed by the failing ``feed`` call, in order (empty when a sticky
            error is raised again).
        index: where the bad frame stood among ``frames``: ``frames[:index]`` came before it. A v1
            :class:`~smith_fast.framing.FrameDecoder` stops at the bad frame, so by default every
            frame came before it (``len(frames)``); the v0 line decoder resyncs at the next newline
            and sets it.
    """

    def __init__(
        self, message: str, offset: int, *, frames: list[bytes] | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.frames: list[bytes] = [] if frames is None else frames
        self._index = index

    @property
    def index(self) -> int:
        return len(self.frames) if self._index is None else self._index

    @index.setter
    def index(self, value: int) -> None:
        self._index = value

    def __reduce__(self) -> tuple[type[FramingError], tuple[object, ...]]:
        return (type(self), (self.args[0], self.offset))


class FrameTooLarge(FramingError):
    """A frame declares a length above the decoder's ``max_frame_size``.

    Raised as soon as the length prefix is read, before any of the payload is buffered.

    Attributes:
        offset: byte offset of the frame's length prefix.
        size: the declared payload length.
        limit: the decoder's ``max_frame_size``.
        complete: whether ``size`` is the whole unit's; False for a v0 line whose newline was not
            seen yet (``size`` is then the bytes so far). Session logs keep it.
    """

    def __init__(
        self,
        message: str,
        offset: int,
        size: int,
        limit: int,
        *,
        frames: list[bytes] | None = None,
        index: int | None = None,
        complete: bool = True,
    ) -> None:
        super().__init__(message, offset, frames=frames, index=index)
        self.size = size
        self.limit = limit
        self.complete = complete

    def __reduce__(self) -> tuple[type[FramingError], tuple[object, ...]]:
        return (type(self), (self.args[0], self.offset, self.size, self.limit))


class EncodeError(SmithFastError, ValueError):
    """A value cannot be encoded on the wire (for example a string with lone surrogates)."""


class ProtocolError(SmithFastError):
    """A peer broke the Smith protocol; ``code`` is the ``smith.v1.ErrorCode`` value to report.

    Attributes:
        code: an ``ErrorCode`` enum value (``smith_fast.pb.smith_pb2.ERROR_CODE_*``).
        request_id: the request the error belongs to, when known.
        details: extra string fields for ``ErrorEvent.details`` (e.g. ``{"reason": "invalid_json"}``).
    """

    def __init__(
        self,
        message: str,
        code: int,
        request_id: str | None = None,
        details: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id
        self.details = details or {}


class ListenError(SmithFastError):
    """A listener cannot be opened as asked (non-loopback without consent, live socket in the way ...)."""


class StartupError(SmithFastError):
    """The service cannot start as configured (a hook that does not load ...)."""


class PlanError(ProtocolError):
    """A plan could not be made: bad input, a bad plan from the model, or an unreachable model.

    It is a :class:`ProtocolError`, so a session reports it as an ``ErrorEvent`` (and the
    request's terminal ``StateChange(ERROR)``) like any other request failure. The message says
    exactly what is wrong: which step, which dependency, which cycle, which HTTP status.

    Attributes:
        code: ``ERROR_CODE_EXECUTION_TIMEOUT`` when the model did not answer in time,
            ``ERROR_CODE_RESOURCE_EXHAUSTED`` for a plan over the step limit, else
            ``ERROR_CODE_UNSPECIFIED`` (the default, 0).
        details: always holds ``reason`` (see :attr:`reason`); also ``step`` (the step's id as the
            planner wrote it), ``dependency``, ``cycle``, ``field`` or ``http_status`` when they apply.
        usage: the model's token usage (a :class:`smith_fast.plan.model.Usage`) when a model
            answered but its plan was rejected (the tokens were spent all the same), else ``None``.
    """

    usage: object | None = None

    def __init__(
        self,
        message: str,
        reason: str = "invalid_plan",
        *,
        code: int = 0,  # smith.v1.ERROR_CODE_UNSPECIFIED; the schema is not imported for a default
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, code, None, {"reason": reason, **(details or {})})

    @property
    def reason(self) -> str:
        """Why, as one word: ``invalid_plan`` (the plan breaks a rule), ``invalid_json`` (the plan
        is not JSON), ``invalid_goal`` (a shell goal that does not parse), ``invalid_field`` (a bad
        ``context`` value), ``too_many_steps``, ``planner_config``, ``planner_unavailable`` (cannot
        connect), ``planner_http`` (a non-200 answer), ``planner_reply`` (an answer that is not a
        chat completion) or ``planner_timeout``."""
        return self.details["reason"]

    def __reduce__(self) -> tuple[type[PlanError], tuple[str, str], dict[str, object]]:
        # The state dict restores the rest (code, details, request_id, usage) over the rebuilt one.
        return (type(self), (self.args[0], self.reason), dict(self.__dict__))


class ResumeRefused(ProtocolError):
    """A resume handshake that cannot be served: ``details.reason`` says why. ``code`` defaults
    to ``ERROR_CODE_PERMISSION_DENIED``."""

    def __init__(self, message: str, reason: str, code: int = 5) -> None:  # 5: ERROR_CODE_PERMISSION_DENIED
        super().__init__(message, code, details={"reason": reason})


# An argument error quotes the offending value; a multi-megabyte string must not be echoed back.
_MAX_REASON = 300


class ArgumentError(SmithFastError, ValueError):
    """The arguments of a tool call are not valid for that tool.

    Raised by argument decoding and validation, and by handlers for problems a schema cannot
    express (an invalid regex, invalid base64). The message reads ``args: <reason> at <path>``,
    or just ``args: <reason>`` when the bytes are not JSON at all (the reason then gives the byte,
    or the line and column).

    Attributes:
        reason: what is wrong.
        path: the JSON path of the offending value (``$`` is the whole arguments value), or
            ``None`` when the arguments are not JSON at all.
    """

    def __init__(self, reason: str, path: str | None = "$") -> None:
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        super().__init__(f"args: {reason}" if path is None else f"args: {reason} at {path}")
        self.reason = reason
        self.path = path

    def __reduce__(self) -> tuple[type[ArgumentError], tuple[str, str | None]]:
        return (type(self), (self.reason, self.path))


class HookLoadError(SmithFastError):
    """A hook cannot be loaded: a syntax or compile error, no trigger defined, an engine missing.

    Attributes:
        diagnostics: the engine's or the compiler's own text (may be empty when there is none).
    """

    def __init__(self, message: str, diagnostics: str = "") -> None:
        super().__init__(f"{message}:\n{diagnostics}" if diagnostics else message)
        self.message = message
        self.diagnostics = diagnostics

    def __reduce__(self) -> tuple[type[HookLoadError], tuple[str, str]]:
        return (type(self), (self.message, self.diagnostics))


class HookFailure(SmithFastError):
    """A call of a hook failed: it threw or panicked, crashed, ran past its time limit, ran out of
    memory or answered something malformed. :class:`~smith_fast.hooks.HookChain` turns this into
    a block (``failure="closed"``) or an allow (``failure="open"``).

    Attributes:
        hook_id: the hook's id.
        trigger: the trigger it was called for.
        reason: what went wrong, in words (e.g. ``"ran past its time limit of 0.5 s"``).
    """

    def __init__(self, hook_id: str, trigger: str, reason: str) -> None:
        super().__init__(f"hook {hook_id} failed in {trigger}: {reason}")
        self.hook_id = hook_id
        self.trigger = trigger
        self.reason = reason

    def __reduce__(self) -> tuple[type[HookFailure], tuple[str, str, str]]:
        return (type(self), (self.hook_id, self.trigger, self.reason))


class LogFormatError(SmithFastError, ValueError):
    """A file is not a session log (bad magic, unknown format version, damaged header).

    A torn or garbled *tail* is not an error: readers stop there and report it instead.

    Attributes:
        path: the file, when known.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class SandboxError(SmithFastError):
    """The sandbox of the processes started for peers (:mod:`smith_fast.sandbox`) failed."""


class ZygoteGone(SandboxError):
    """A session's sandbox process (:mod:`smith_fast.sandbox.zygote`) cannot take a command (it
    ended, or its socket is full): the command starts the one-shot way."""


class SandboxUnavailable(SandboxError):
    """The sandbox cannot be had (no helper, a kernel without what the mode needs); the service
    refuses to start."""


class UnsafeRoot(SandboxUnavailable):
    """``--root`` holds the service's own files (its code, socket, recordings or state): commands
    could replace what the service runs; the service refuses to start."""


class LandlockError(SandboxError, OSError):
    """A process could not be confined by Landlock as asked (the sandbox program said why); it
    did not run. ``errno`` and ``strerror`` as for any :class:`OSError`."""


class WorkspacesUnavailable(SandboxUnavailable):
    """``serve --workspaces`` cannot be had on this kernel or in this configuration (user
    namespaces off, no overlayfs, a kernel without ``lowerdir+``); the message says what is
    missing. The service refuses to start."""


class MountError(SandboxError, OSError):
    """The workspaces' mount host refused a request (a path outside its directory) or the kernel
    failed it; ``errno`` and ``strerror`` as for any :class:`OSError`, the message the host's."""


class EgressError(SmithFastError):
    """The egress proxy of ``--network allow`` (:mod:`smith_fast.egress`) failed."""


class EgressRuleError(EgressError, ValueError):
    """An ``--egress-allow``/``--egress-deny``/``--egress-secret``/``--egress-resolve`` value the
    proxy cannot use (a malformed pattern, a secret whose environment variable is not set); the
    message names the value and says what is wrong. A ValueError, so the commands print it as one
    line, as any bad option; the service refuses to start."""

# ---- HTTP ---------------------------------------------------------------------------------------
# The shared HTTP/1.1 server (smith_fast/http: the MCP front, /metrics) and the planner's client.

__all__ += ["HttpRefused", "HeadError", "HttpError"]


class HttpRefused(SmithFastError):
    """A request the HTTP server answers with an error status instead of serving it.

    Attributes:
        status: the HTTP status of the answer.
        close: the connection cannot go on after it (a body left unread, a broken head).
        headers: extra response headers (``WWW-Authenticate``, ``Allow`` ...).
    """

    def __init__(self, status: int, message: str, *, close: bool = False, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.headers = headers


class HeadError(HttpRefused):
    """A request head refused as malformed or ambiguous (or too large): answered, then the
    connection is closed, since where the next request would start is unknown."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message, close=True)


class HttpError(SmithFastError):
    """An HTTP exchange of the client failed below HTTP semantics: bad URL, no connection, a
    malformed, truncated or oversize response.

    Attributes:
        connect: ``True`` when no connection could be made (nothing was sent).
    """

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


# ---- client and NATS ------------------------------------------------------------------------------


class SmithError(SmithFastError):
    """The service answered a request with an ``ErrorEvent`` (raised by the client, ``smith_fast.client``).

    Attributes:
        code: the ``ErrorCode`` value; ``code_name`` its name (``ERROR_CODE_EXECUTION_TIMEOUT`` ...).
        request_id: the request it concerns, if any.
        details: ``ErrorEvent.details``.
    """

    def __init__(self, error: pb.ErrorEvent) -> None:
        from .pb import smith_pb2  # here, not at the top: the wire core raises these errors without protobuf loaded

        name = smith_pb2.ErrorCode.Name(error.error_code)
        super().__init__(f"{name}: {error.message}")
        self.code = error.error_code
        self.code_name = name
        self.request_id = error.request_id if error.HasField("request_id") else None
        self.details = dict(error.details)
        self.error = error


class ConnectionClosed(SmithFastError):
    """The connection ended before the awaited answer arrived."""


class ConnectError(ConnectionClosed, ConnectionError):
    """The service cannot be reached; the message names the address and says what to check.

    A :class:`ConnectionClosed` (what a handshake on a dead connection raised before) and an
    ``OSError`` (what connecting raised before), so that existing handlers of either still apply.
    """


class NotASmithService(ConnectError):
    """Something answers at the address, but not the Smith protocol (an HTTP server, a gRPC port
    reached as a socket, the metrics port ...), or nothing answered the handshake in time."""


class AddressError(SmithFastError, ValueError):
    """An address that is none of ``smith_fast.client.ADDRESS_FORMS``."""


class NatsCredentialError(SmithFastError, ValueError):
    """A NATS key or credentials file (``smith-fast nats-auth``, ``--nats-nkey``, ``--nats-creds``)
    that cannot be written or used: unreadable, open to other users, not a key. The message names
    the file; a ValueError so that the commands print it as one line, as any bad option."""
