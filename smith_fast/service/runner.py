"""The request runner seam: how a session's admitted requests are run, steered and ended.

A :class:`~smith_fast.service.session.Session` keeps the protocol state (handshake, grants, token,
flow control, teardown) and admits each request (capability, size, request id, ``--max-requests``);
what happens to an admitted request is its :class:`RequestRunner`'s business:

* :class:`LocalRunner` (``serve``, a NATS worker) runs it here with the handler of its row in
  :data:`~smith_fast.service.commands.COMMANDS`: ``PROCESSING``, the handler's events, then
  ``READY`` or its error and ``ERROR``;
* ``smith_fast.nats.gateway.NatsRunner`` (``gateway``) forwards the command to the workers and
  passes their events through.

A runner is made per session by the core's runner factory (``ServiceCore(runner=...)``) from the
session's :class:`RequestHost` view. What a later command does to a *running* request (cancel,
stdin, resize, attach) belongs here too: a method on :class:`RequestRunner`, implemented once per
runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .execution import ExecutionCore
from .session_hooks import SessionHooks

if TYPE_CHECKING:
    from ..hooks import Hook, HookLimits
    from ..process import ShellProcess
    from .commands import CommandSpec
    from .metrics import ServiceMetrics
    from .session_hooks import HookShelf
    from .sinks import EventSink

__all__ = ["RequestHost", "RequestRunner", "RunnerFactory", "LocalRunner", "RunnerCore", "local_runner"]

log = get_logger("smith_fast.session")


class RequestHost(Protocol):
    """What a runner sees of its session."""

    @property
    def sink(self) -> EventSink: ...

    @property
    def peer(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def granted(self) -> frozenset[int]: ...

    @property
    def span(self) -> tracing.SpanHandle:
        """The session's span (:data:`~smith_fast.tracing.NOOP` unless tracing was granted)."""
        ...

    @property
    def paused(self) -> bool: ...

    @property
    def shutting(self) -> bool: ...

    @property
    def closing(self) -> bool:
        """The session is over: nobody reads what would be sent now."""
        ...

    def protocol_error(self, exc: ProtocolError) -> None:
        """Report (and count) an error with the request it names."""
        ...

    async def reading(self) -> None:
        """Return once the peer reads (at once unless the session is paused)."""
        ...

    def report_error(self, code: int, message: str, rid: str | None = None, details: Mapping[str, str] | None = None) -> None:
        """Send (and count) an ``ErrorEvent``."""
        ...

    def reject(self, exc: ProtocolError) -> None:
        """Report an error, then its request's terminal ``ERROR`` state."""
        ...


class RequestRunner(Protocol):
    """Runs the admitted requests of one session."""

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        """Run one request until its terminal state was sent.

        The session made sure it may run (``command`` holds a request of ``spec.kind`` with id
        ``rid``); cancelling the awaiting task ends it (shutdown, teardown).
        """
        ...

    def pause(self) -> None:
        """The peer stopped reading: stop producing output."""
        ...

    def resume(self) -> None:
        """The peer reads again."""
        ...

    async def shutdown(self, grace: float) -> None:
        """The session shuts down: end what runs within ``grace`` s, final events still sent."""
        ...

    def kill(self) -> None:
        """The session is torn down: stop what runs at once."""
        ...

    def end(self) -> None:
        """The session is over (every way it ends passes here once): release what it held."""
        ...


RunnerFactory = Callable[[RequestHost], RequestRunner]
"""Makes the runner of a new session (``ServiceCore(runner=...)``)."""


class LocalRunner:
    """Runs requests here, with the handlers of the command table (an
    :class:`~smith_fast.service.execution.Execution`).

    Args:
        core: tools, limits, planner, process slots, global hooks.
        host: the session.
        hooks: the session's hooks to start with (a NATS worker passes the gateway session's).
        shelf: keeps the hooks this session loads beyond it (a NATS worker's session state); then
            the shelf, not this runner, closes them.
    """

    def __init__(
        self,
        core: RunnerCore,
        host: RequestHost,
        *,
        hooks: Sequence[Hook] = (),
        shelf: HookShelf | None = None,
    ) -> None:
        self.core = core
        self._host = host
        self.sink = host.sink
        self.processes: set[ShellProcess] = set()
        self.spans: dict[str, tracing.SpanHandle] = {}  # request id -> its command span
        self.hooks = SessionHooks(
            core.global_hooks,
            failure=core.config.hook_failure,
            limits=core.hook_limits,
            emit=host.sink.event,
            count=core.metrics.hook_decision,
            spans=self.spans,
            peer=host.peer,
            hooks=hooks,
            shelf=shelf,
        )

    @property
    def paused(self) -> bool:
        return self._host.paused

    @property
    def shutting(self) -> bool:
        return self._host.shutting

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        host = self._host
        sink = self.sink
        handler = spec.handler
        assert handler is not None  # the session starts only rows with a handler
        sink.state_change(pb.SERVICE_STATE_PROCESSING, rid)
        session_span = host.span
        span = session_span.command_span(spec.kind, rid) if session_span is not tracing.NOOP else tracing.NOOP
        if span is not tracing.NOOP:
            self.spans[rid] = span
        try:
            await handler(self, rid, getattr(command, spec.kind))
        except ProtocolError as exc:
            exc.request_id = exc.request_id or rid
            span.fail(pb.ErrorCode.Name(exc.code), str(exc))
            host.protocol_error(exc)
            sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        except asyncio.CancelledError:
            if not host.closing:  # shutdown, not disconnect: somebody is listening
                host.report_error(pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", rid, {"reason": "cancelled"})
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            log.exception("request failed", extra={"fields": {"peer": host.peer, "request_id": rid}})
            host.report_error(pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", rid)
            sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        else:
            sink.state_change(pb.SERVICE_STATE_READY, rid)
        finally:
            if span is not tracing.NOOP:
                self.spans.pop(rid, None)
                span.end()

    async def reading(self) -> None:
        await self._host.reading()

    def pause(self) -> None:
        for proc in self.processes:
            proc.pause_reading()

    def resume(self) -> None:
        for proc in self.processes:
            proc.resume_reading()

    async def shutdown(self, grace: float) -> None:
        # Stop children gracefully so their last output and exit codes are still delivered.
        await asyncio.gather(*(p.terminate(grace) for p in list(self.processes)), return_exceptions=True)

    def kill(self) -> None:
        for proc in list(self.processes):
            proc.close()

    def end(self) -> None:
        if self.hooks.owns_hooks:
            asyncio.get_running_loop().create_task(self.hooks.close())  # Rust hooks' processes end with the session


class RunnerCore(ExecutionCore, Protocol):
    """What the local runner takes from the core: an execution core, plus hooks and counters."""

    @property
    def global_hooks(self) -> list[Hook]: ...

    @property
    def hook_limits(self) -> HookLimits: ...

    @property
    def metrics(self) -> ServiceMetrics: ...


def local_runner(core: RunnerCore) -> RunnerFactory:
    """The factory of ``serve``'s runners: each session's requests run here on ``core``."""
    return lambda host: LocalRunner(core, host)
