"""OpenTelemetry tracing for the ``tracing`` capability: a span per session and per command.

The service calls :func:`setup_from_env` once at start. When the standard ``OTEL_*`` variables ask
for traces (``OTEL_TRACES_EXPORTER``, or an ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``) and the SDK is
installed, it installs an SDK tracer provider with those exporters (``console`` writes to stderr,
since stdout may be the protocol channel; ``otlp`` needs ``smith-fast[tracing]``); sampling and
batching follow ``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*`` as the SDK reads them. Otherwise the
OpenTelemetry API stays a no-op, which still carries a caller's trace context through: a session
continued from a ``traceparent`` hands that same trace on to its child processes and log fields.

Per session, the service keeps a :class:`SpanHandle`: :func:`session_span` when ``tracing`` was
granted, else :data:`NOOP`, whose every method does nothing (one method call: the cost of tracing
not granted). Per command, ``handle.command_span(...)`` (or :func:`command_span`) starts a child
span, ended with :meth:`SpanHandle.end` or by leaving its ``with`` block. Handles never touch the
ambient context (no ``contextvars`` attach), so they are safe to hold across ``await`` and tasks.

Trace context comes in as a W3C ``traceparent`` (and optional ``tracestate``), either as a string or
inside a mapping such as ``HandshakeCommand.client_info`` or ``PlanCommand.context`` (keys matched
case-insensitively). It goes out to children as ``TRACEPARENT``/``TRACESTATE``/``SMITH_TRACE_ID``
environment variables (:func:`child_env`) and into ``LogEvent.fields`` as ``trace_id``/``span_id``
(:func:`log_fields`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

from ._version import __version__
from .logs import get_logger


class _OnFirstUse:
    """``opentelemetry.trace``, imported when a span is first made or a trace context read: a
    session that was not granted ``tracing`` never does, and the import (some 5 ms, typing_extensions
    with it) is not paid on the way to every start's first answer. The first attribute read puts the
    module itself in its place."""

    def __getattr__(self, name: str) -> Any:
        global _trace
        from opentelemetry import trace

        _trace = trace
        return getattr(trace, name)


_trace: Any = _OnFirstUse()
# the API is a dependency; this only guards a broken install
HAVE_API = importlib.util.find_spec("opentelemetry.trace") is not None

__all__ = [
    "ATTR_BYTES_STDERR",
    "ATTR_BYTES_STDOUT",
    "ATTR_COMMAND",
    "ATTR_ERROR_CODE",
    "ATTR_EXIT_CODE",
    "ATTR_HOOK_DECISION",
    "ATTR_HOOK_TYPE",
    "ATTR_KIND",
    "ATTR_PEER",
    "ATTR_PROTOCOL_VERSION",
    "ATTR_REQUEST_ID",
    "ATTR_TOOL",
    "HAVE_API",
    "NOOP",
    "SpanHandle",
    "child_env",
    "command_span",
    "configured",
    "log_fields",
    "remote_span",
    "session_span",
    "setup_from_env",
    "shutdown",
    "traceparent_from",
    "tracer",
    "use_tracer_provider",
]

log = get_logger("smith_fast.tracing")

# Span attribute names (smith.* for the protocol's own notions).
ATTR_PEER = "smith.peer"
ATTR_PROTOCOL_VERSION = "smith.protocol_version"
ATTR_KIND = "smith.command"
ATTR_REQUEST_ID = "smith.request_id"
ATTR_TOOL = "smith.tool"
ATTR_COMMAND = "smith.shell.command"
ATTR_EXIT_CODE = "smith.exit_code"
ATTR_BYTES_STDOUT = "smith.bytes.stdout"
ATTR_BYTES_STDERR = "smith.bytes.stderr"
ATTR_ERROR_CODE = "smith.error_code"
ATTR_HOOK_TYPE = "smith.hook.type"
ATTR_HOOK_DECISION = "smith.hook.decision"

_provider: Any = None  # the SDK provider we use (set by setup_from_env or use_tracer_provider)
_owned_provider: Any = None  # the one setup_from_env made, to shut down at exit
_tracer: Any = None
_propagator: Any = None  # a TraceContextTextMapPropagator, made on first use (see _OnFirstUse)


# ---- setup -------------------------------------------------------------------------------------


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    if name == "otlp":
        proto = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        name = "otlp_proto_http" if proto.startswith("http") else "otlp_proto_grpc"
    import importlib.metadata  # only with an exporter asked for: some 8 ms of every start otherwise

    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
    for entry in found:
        return entry.load()()
    return None


def setup_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Install an SDK tracer provider if the ``OTEL_*`` variables ask for traces.

    Traces are asked for by ``OTEL_TRACES_EXPORTER`` (a comma-separated list: ``console``,
    ``otlp``, or any installed exporter entry point; ``none`` disables), or, without it, by an
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_ENDPOINT`` (meaning ``otlp``).
    ``OTEL_SDK_DISABLED=true`` wins over both. The resource's ``service.name`` defaults to
    ``smith-fast`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` set one.

    Args:
        environ: the variables to read (default ``os.environ``). The SDK itself still reads
            sampler, batching and exporter settings from ``os.environ``.

    Returns:
        True when spans will be recorded and exported; False when the API stays a no-op (not
        asked for, SDK or exporter not installed: the latter two are logged as warnings).
    """
    global _provider, _owned_provider, _tracer
    env = os.environ if environ is None else environ
    if not HAVE_API or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    spec = env.get("OTEL_TRACES_EXPORTER")
    if spec is None:
        if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
            return False
        spec = "otlp"
    names = [n for n in (part.strip().lower() for part in spec.split(",")) if n and n != "none"]
    if not names:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables ask for traces, but opentelemetry-sdk is not installed (pip install smith-fast[tracing])")
        return False
    attributes: dict[str, str] = {"service.version": __version__}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "smith-fast"
    provider = TracerProvider(resource=Resource.create(attributes))
    added = 0
    for name in names:
        try:
            exporter = _exporter(name, env)
        except Exception as exc:  # an exporter that cannot start must not stop the service
            log.warning("trace exporter failed to start", extra={"fields": {"exporter": name, "error": str(exc)}})
            continue
        if exporter is None:
            log.warning(
                "unknown or uninstalled trace exporter (otlp needs pip install smith-fast[tracing])",
                extra={"fields": {"exporter": name}},
            )
            continue
        # console is for eyes: export each span as it ends. Everything else goes in batches.
        provider.add_span_processor(SimpleSpanProcessor(exporter) if name == "console" else BatchSpanProcessor(exporter))
        added += 1
    if not added:
        return False
    _trace.set_tracer_provider(provider)
    _provider = _owned_provider = provider
    _tracer = None
    log.info("tracing enabled", extra={"fields": {"exporters": names}})
    return True


def use_tracer_provider(provider: Any) -> None:
    """Use ``provider`` for smith-fast's spans without touching the global one (tests, embedding).

    Args:
        provider: an ``opentelemetry.trace.TracerProvider``, or None to go back to the global one.
    """
    global _provider, _tracer
    _provider = provider
    _tracer = None


def configured() -> bool:
    """True when an SDK provider records smith-fast's spans."""
    return _provider is not None


def shutdown() -> None:
    """Flush and shut down the provider :func:`setup_from_env` installed (call once, at exit)."""
    global _owned_provider
    if _owned_provider is not None:
        _owned_provider.shutdown()
        _owned_provider = None


def tracer() -> Any:
    """smith-fast's ``opentelemetry.trace.Tracer`` (a no-op one until a provider is set up)."""
    global _tracer
    if _tracer is None and HAVE_API:
        source = _provider if _provider is not None else _trace.get_tracer_provider()
        _tracer = source.get_tracer("smith_fast", __version__)
    return _tracer


# ---- context in and out ------------------------------------------------------------------------


def traceparent_from(carrier: Mapping[str, str] | None) -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` from a mapping such as ``client_info``, keys in any case."""
    if not carrier:
        return None, None
    parent = state = None
    for key, value in carrier.items():
        low = key.lower()
        if low == "traceparent":
            parent = value
        elif low == "tracestate":
            state = value
    return parent, state


def _parent_context(parent: str | Mapping[str, str] | None) -> Any:
    """An OpenTelemetry Context holding the remote span ``parent`` names, or None if it names none."""
    if parent is None or not HAVE_API:
        return None
    if isinstance(parent, str):
        carrier = {"traceparent": parent}
    else:
        tp, ts = traceparent_from(parent)
        if tp is None:
            return None
        carrier = {"traceparent": tp} if ts is None else {"traceparent": tp, "tracestate": ts}
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    ctx = _propagator.extract(carrier)
    return ctx if _trace.get_current_span(ctx).get_span_context().is_valid else None


# ---- span handles --------------------------------------------------------------------------------


class SpanHandle:
    """One span, started and ended explicitly (usable across ``await``; never made "current").

    Also a context manager: leaving the block ends the span, recording an exception that escaped
    it and marking the span as failed.

    Attributes:
        span: the ``opentelemetry.trace.Span`` (None on :data:`NOOP`).
    """

    __slots__ = ("span", "_ended", "_ctx", "_env", "_fields")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._ended = False
        # A span's context never changes: what is derived from it is computed once, on first use.
        self._ctx: Any = None
        self._env: dict[str, str] | None = None
        self._fields: dict[str, str] | None = None

    def _context(self) -> Any:
        """An OpenTelemetry Context with this span as the parent of new spans."""
        if self._ctx is None:
            self._ctx = _trace.set_span_in_context(self.span)
        return self._ctx

    @property
    def recording(self) -> bool:
        """True when attributes set on this span are kept (an SDK is recording it)."""
        return bool(self.span.is_recording())

    @property
    def trace_id(self) -> str | None:
        """The trace id as 32 hex digits, or None when there is no valid trace."""
        sc = self.span.get_span_context()
        return f"{sc.trace_id:032x}" if sc.is_valid else None

    @property
    def traceparent(self) -> str | None:
        """This span as a W3C ``traceparent`` value, or None when there is no valid trace."""
        sc = self.span.get_span_context()
        if not sc.is_valid:
            return None
        return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"

    def set(self, key: str, value: Any) -> None:
        """Set one attribute (str, bool, int, float, or a sequence of one of those)."""
        self.span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Set several attributes."""
        self.span.set_attributes(attributes)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Add a timestamped event to the span."""
        self.span.add_event(name, attributes or {})

    def hook_decision(self, hook_type: str, decision: str, reason: str | None = None) -> None:
        """Record a hook's verdict: attribute ``smith.hook.decision`` and a ``hook`` event.

        Args:
            hook_type: ``js`` or ``rust``.
            decision: ``allow``, ``block`` or ``transform``.
            reason: the block reason, if any.
        """
        self.span.set_attribute(ATTR_HOOK_DECISION, decision)
        attrs = {ATTR_HOOK_TYPE: hook_type, ATTR_HOOK_DECISION: decision}
        if reason:
            attrs["smith.hook.reason"] = reason
        self.span.add_event("hook", attrs)

    def fail(self, error_code: str, message: str = "") -> None:
        """Mark the span as failed: status ERROR with ``message``, attribute ``smith.error_code``.

        Args:
            error_code: the ``ErrorCode`` name (``ERROR_CODE_EXECUTION_TIMEOUT`` ...).
            message: the ErrorEvent's message.
        """
        self.span.set_attribute(ATTR_ERROR_CODE, error_code)
        self.span.set_status(_trace.Status(_trace.StatusCode.ERROR, message or error_code))

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        """Set ``attributes`` (e.g. exit code, byte counts) and end the span. Later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        if attributes:
            self.span.set_attributes(attributes)
        self.span.end()

    def command_span(
        self,
        kind: str,
        request_id: str,
        attributes: Mapping[str, Any] | None = None,
        parent_traceparent: str | Mapping[str, str] | None = None,
    ) -> SpanHandle:
        """Start a command's span as a child of this session span; see :func:`command_span`."""
        return command_span(kind, request_id, attributes, parent_traceparent, session=self)

    def child_env(self) -> dict[str, str]:
        """See :func:`child_env`."""
        return child_env(self)

    def log_fields(self) -> dict[str, str]:
        """See :func:`log_fields`."""
        return log_fields(self)

    def __enter__(self) -> SpanHandle:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and not self._ended:
            self.span.record_exception(exc)
            self.span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.end()

    def __repr__(self) -> str:
        return f"<SpanHandle {self.traceparent or 'no trace'}>"


class _NoopHandle(SpanHandle):
    """The handle of a session without the ``tracing`` capability: every call does nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)
        self._ended = True

    recording = False
    trace_id = None
    traceparent = None

    def set(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def hook_decision(self, hook_type: str, decision: str, reason: str | None = None) -> None:
        pass

    def fail(self, error_code: str, message: str = "") -> None:
        pass

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def command_span(
        self,
        kind: str,
        request_id: str,
        attributes: Mapping[str, Any] | None = None,
        parent_traceparent: str | Mapping[str, str] | None = None,
    ) -> SpanHandle:
        return self

    def child_env(self) -> dict[str, str]:
        return {}

    def log_fields(self) -> dict[str, str]:
        return {}

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "<SpanHandle NOOP>"


NOOP: SpanHandle = _NoopHandle()
"""The handle for a session (and its commands) without the ``tracing`` capability."""


def session_span(
    peer: str,
    protocol_version: int,
    parent_traceparent: str | Mapping[str, str] | None = None,
    *,
    attributes: Mapping[str, Any] | None = None,
) -> SpanHandle:
    """Start the span of a session (kind SERVER, name ``smith.session``).

    Args:
        peer: the peer's printable address (attribute ``smith.peer``).
        protocol_version: 1 or 0 (attribute ``smith.protocol_version``).
        parent_traceparent: the caller's trace, as a ``traceparent`` string or a mapping holding
            ``traceparent`` (and ``tracestate``), such as ``client_info``; an invalid or missing
            one starts a new trace.
        attributes: more attributes.

    Returns:
        The session's handle (:data:`NOOP` if the OpenTelemetry API is missing).
    """
    if not HAVE_API:
        return NOOP
    attrs: dict[str, Any] = {ATTR_PEER: peer, ATTR_PROTOCOL_VERSION: protocol_version}
    if attributes:
        attrs.update(attributes)
    span = tracer().start_span(
        "smith.session", context=_parent_context(parent_traceparent), kind=_trace.SpanKind.SERVER, attributes=attrs
    )
    return SpanHandle(span)


def remote_span(traceparent: str | None) -> SpanHandle:
    """A handle for a span of another process, named by its W3C ``traceparent``.

    Nothing is recorded for it; commands started under it (:meth:`SpanHandle.command_span`) are
    its children. A ``smith-fast worker`` runs each command under the gateway's session span this
    way.

    Returns:
        The handle, or :data:`NOOP` when ``traceparent`` is missing or invalid.
    """
    ctx = _parent_context(traceparent)
    if ctx is None:
        return NOOP
    return SpanHandle(_trace.get_current_span(ctx))


def command_span(
    kind: str,
    request_id: str,
    attributes: Mapping[str, Any] | None = None,
    parent_traceparent: str | Mapping[str, str] | None = None,
    *,
    session: SpanHandle | None = None,
) -> SpanHandle:
    """Start the span of one command (name ``smith.<kind>``, e.g. ``smith.shell_exec``).

    Its parent is the trace named by ``parent_traceparent`` when that is valid (a request that
    carries its caller's context continues that trace, with a link to the session span), else
    ``session``'s span, else none (a new trace).

    Args:
        kind: the command (``shell_exec``, ``tool_call``, ``hook_load``, ``plan`` ...).
        request_id: attribute ``smith.request_id``.
        attributes: more attributes (``smith.tool``, ``smith.shell.command`` ...).
        parent_traceparent: a ``traceparent`` string, or a mapping holding one (a request's
            ``context`` or ``env``).
        session: the session's handle; :data:`NOOP` makes this return :data:`NOOP` at once.

    Returns:
        The command's handle; end it with :meth:`SpanHandle.end` or a ``with`` block.
    """
    if session is NOOP or not HAVE_API:
        return NOOP
    attrs: dict[str, Any] = {ATTR_KIND: kind, ATTR_REQUEST_ID: request_id}
    if attributes:
        attrs.update(attributes)
    ctx = _parent_context(parent_traceparent)
    links = None
    if ctx is None:
        if session is not None:
            ctx = session._context()
    elif session is not None and session.span.get_span_context().is_valid:
        links = [_trace.Link(session.span.get_span_context())]
    span = tracer().start_span(f"smith.{kind}", context=ctx, kind=_trace.SpanKind.INTERNAL, attributes=attrs, links=links)
    return SpanHandle(span)


def child_env(span: SpanHandle | Any) -> dict[str, str]:
    """Environment variables that hand ``span``'s trace to a child process.

    Args:
        span: a :class:`SpanHandle` or an ``opentelemetry.trace.Span``.

    Returns:
        ``TRACEPARENT`` (W3C, naming ``span`` as the parent), ``SMITH_TRACE_ID`` (32 hex digits)
        and ``TRACESTATE`` when there is one; empty when there is no valid trace.
    """
    if isinstance(span, SpanHandle):
        if span._env is None:
            span._env = _child_env(span.span)
        return dict(span._env)
    return _child_env(span)


def _child_env(span: Any) -> dict[str, str]:
    if span is None:
        return {}
    sc = span.get_span_context()
    if not sc.is_valid:
        return {}
    trace_id = f"{sc.trace_id:032x}"
    env = {"TRACEPARENT": f"00-{trace_id}-{sc.span_id:016x}-{int(sc.trace_flags):02x}", "SMITH_TRACE_ID": trace_id}
    if sc.trace_state:
        env["TRACESTATE"] = sc.trace_state.to_header()
    return env


def log_fields(span: SpanHandle | Any) -> dict[str, str]:
    """``{"trace_id": <32 hex>, "span_id": <16 hex>}`` for ``LogEvent.fields``; empty without a trace.

    Args:
        span: a :class:`SpanHandle` or an ``opentelemetry.trace.Span``.
    """
    if isinstance(span, SpanHandle):
        if span._fields is None:
            span._fields = _log_fields(span.span)
        return dict(span._fields)
    return _log_fields(span)


def _log_fields(span: Any) -> dict[str, str]:
    if span is None:
        return {}
    sc = span.get_span_context()
    if not sc.is_valid:
        return {}
    return {"trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}"}
