"""The service's side of ``--network allow``: one egress proxy, a session's narrowing, a request's listener.

The proxy itself is :mod:`smith_fast.egress`; this module gives it what it serves and hears what
it did. The pieces, from the longest-lived:

* :class:`EgressHub` (the core's, one per service): the operator's :class:`EgressPolicy`
  (``--egress-allow``/``--egress-deny``/``--egress-secret``), the resolver and the one
  :class:`EgressProxy`.
* :class:`SessionEgress` (one per session, made at its handshake): the policy in force for it,
  narrowed by ``client_info["smith_fast.egress_allow"]`` (PROTOCOL.md) and never widened.
* :class:`RequestEgress` (one per sandboxed process): a socketpair whose one end goes to the
  sandbox program (``--egress-fd``), which sends back the listener it made inside the command's
  network namespace (``csrc/egress_listener.h``); the proxy serves that listener with a
  :class:`RequestObserver` until the process ends. A listener belongs to one request, so every
  connection is attributed to its session and request without looking at addresses.
* :class:`RequestObserver`: a refusal becomes a ``LogEvent`` to the peer (host, port, rule), a
  finished connection an audit line (logger ``smith_fast.audit``, event ``egress``), and an
  attempt first goes through the session's ``before_connect`` hooks (a block: rule ``hook:<id>``).

Secrets: a command's environment holds the placeholders only; the real values are concealed in
every log line (:func:`smith_fast.logs.conceal`), put back to their placeholders in the plain-HTTP
responses of the hosts that got them (:mod:`smith_fast.egress.http_response`), and replaced by
``[secret NAME]`` in the output of a command that prints one, across reads
(:meth:`RequestEgress.redacting`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import logs
from ..errors import EgressRuleError
from ..logs import get_logger, log_fields
from ..pb import smith_pb2 as pb
from ..sandbox import EGRESS_PORT

# smith_fast.egress (the proxy, ~20 ms of imports) is imported when --network allow makes an EgressHub:
# every service imports this module, few run the proxy.
if TYPE_CHECKING:
    from ..egress import Attempt, EgressPolicy, EgressProxy, Record, Resolver, Served, Verdict
    from ..shell_process import ShellProcess
    from .config import ServiceConfig
    from .session_hooks import SessionHooks
    from .sinks import EventSink

__all__ = [
    "EGRESS_ALLOW_KEY",
    "EgressHub",
    "EgressUser",
    "RequestEgress",
    "RequestObserver",
    "SessionEgress",
    "open_egress",
    "parse_allow_list",
    "proxy_environment",
]

EGRESS_ALLOW_KEY = "smith_fast.egress_allow"
"""The handshake's ``client_info`` key that narrows a session's allow-list (a comma list or a JSON list)."""
NO_PROXY = "localhost,127.0.0.1,::1"
"""What a command reaches without the proxy: its own loopback (a server it started itself)."""

EGRESS_REFUSED = "egress_refused"
"""A refusal's ``LogEvent.fields["reason"]`` (with ``host``, ``port``, ``rule``): what a front explains it by."""

_audit = get_logger("smith_fast.audit")
# Each connection's task (a request's listener outlives no process, but its closing does not wait).
_following: set[asyncio.Task[None]] = set()


def proxy_environment(placeholders: dict[str, str]) -> dict[str, str]:
    """The variables a ``--network allow`` command gets: the proxy for curl, pip, npm, git and
    urllib (upper and lower case: curl reads only ``http_proxy`` in lower case), ``NO_PROXY`` for
    its own loopback, and each secret's placeholder."""
    http = f"http://127.0.0.1:{EGRESS_PORT}"
    env: dict[str, str] = {}
    for name, value in (("HTTP_PROXY", http), ("HTTPS_PROXY", http), ("ALL_PROXY", f"socks5h://127.0.0.1:{EGRESS_PORT}"),
                        ("NO_PROXY", NO_PROXY)):
        env[name] = env[name.lower()] = value
    env.update(placeholders)
    return env


def parse_allow_list(text: str) -> list[str]:
    """``client_info["smith_fast.egress_allow"]``: a JSON list of strings (``["pypi.org", "*.pythonhosted.org"]``)
    or a comma list (``pypi.org,*.pythonhosted.org``); empty entries are dropped, and an empty list
    allows nothing.

    Raises:
        EgressRuleError: a JSON value that is no list of strings.
    """
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except ValueError as exc:
            raise EgressRuleError(f"{EGRESS_ALLOW_KEY}: not a JSON list: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise EgressRuleError(f"{EGRESS_ALLOW_KEY}: a JSON list must hold strings only")
        items = value
    else:
        items = stripped.split(",")
    return [item.strip() for item in items if item.strip()]


class EgressHub:
    """The service's egress: the operator's policy and the one proxy (``--network allow`` only).

    Raises:
        EgressRuleError: an ``--egress-*`` value it cannot use (the service does not start).
    """

    def __init__(self, config: ServiceConfig) -> None:
        from ..egress import EgressLimits, EgressPolicy, EgressProxy, OverrideResolver, SystemResolver, parse_overrides

        self.policy = EgressPolicy.from_options(config.egress_allow, config.egress_deny, config.egress_secrets)
        for secret in self.policy.secrets:
            logs.conceal(secret.value)  # a log line that quotes it (a command's text, a peer's message) shows <redacted>
        self._resolver: Resolver | None = (
            OverrideResolver(parse_overrides(config.egress_resolve), SystemResolver()) if config.egress_resolve else None)
        limits = config.limits
        if limits.egress_max_head < 1 or limits.egress_max_connections < 1:
            raise EgressRuleError("--egress-max-head and --egress-max-connections must be at least 1")
        self.proxy = EgressProxy(self.policy, resolver=self._resolver, limits=EgressLimits(
            max_head=limits.egress_max_head, handshake_timeout=limits.egress_handshake_timeout,
            connect_timeout=limits.egress_connect_timeout, idle_timeout=limits.egress_idle_timeout,
            max_connections=limits.egress_max_connections))

    def for_session(self, session_id: str, peer: str, allow: str | None) -> SessionEgress:
        """The egress of a session whose handshake gave ``allow`` (None: the operator's list as it is).

        A narrowed session's listeners are served under the narrowed policy (the same proxy): the
        narrowing applies to the resolved addresses too, which a hook's verdict on the name alone could not.

        Raises:
            EgressRuleError: ``allow`` is no list, or holds a pattern that does not parse.
        """
        if allow is None:
            return SessionEgress(self.proxy, self.proxy.policy, session_id, peer, None)
        narrowing = parse_allow_list(allow)
        return SessionEgress(self.proxy, self.proxy.policy.narrowed(narrowing), session_id, peer, narrowing)


class SessionEgress:
    """One session's egress: the proxy and policy its commands' connections are served with."""

    def __init__(self, proxy: EgressProxy, policy: EgressPolicy, session_id: str, peer: str,
                 narrowing: list[str] | None) -> None:
        self.proxy = proxy
        self.policy = policy
        self.session_id = session_id
        self.peer = peer
        self.narrowing = narrowing

    def info(self) -> dict[str, str]:
        """``Ready.service_info``: the operator's allow-list and, when the handshake narrowed it, the
        session's (a destination must match one pattern of each)."""
        info = {EGRESS_ALLOW_KEY: ",".join(rule.text for rule in self.policy.allow)}
        if self.narrowing is not None:
            info["smith_fast.egress_session_allow"] = ",".join(self.narrowing)
        return info

    def open(self, rid: str, sink: EventSink, hooks: SessionHooks) -> RequestEgress:
        """The egress of one process of request ``rid`` (:func:`smith_fast.service.spawn.spawn` takes it)."""
        return RequestEgress(self.proxy, self.policy, RequestObserver(self.session_id, self.peer, rid, sink, hooks))


class EgressUser(Protocol):
    """What :func:`open_egress` needs of a session (an :class:`~smith_fast.service.execution.Execution`)."""

    @property
    def egress(self) -> SessionEgress | None: ...

    @property
    def sink(self) -> EventSink: ...

    @property
    def hooks(self) -> SessionHooks: ...


def open_egress(ex: EgressUser, rid: str) -> RequestEgress | None:
    """The egress of a process request ``rid`` starts in session ``ex``; None without ``--network allow``."""
    egress = ex.egress
    return egress.open(rid, ex.sink, ex.hooks) if egress is not None else None


class RequestObserver:
    """What a request's connections tell the service (the proxy's :class:`~smith_fast.egress.Observer`)."""

    def __init__(self, session_id: str, peer: str, rid: str, sink: EventSink, hooks: SessionHooks) -> None:
        self._session = session_id
        self._peer = peer
        self._rid = rid
        self._sink = sink
        self._hooks = hooks

    async def before_connect(self, attempt: Attempt) -> Verdict | None:
        """The session's ``before_connect`` hooks (HOOKS.md): a block refuses with rule ``hook:<id>``;
        an allow leaves the decision to the rules (a hook cannot open what they refuse)."""
        if not self._hooks.handles("before_connect"):
            return None
        payload = {"host": attempt.host, "port": attempt.port, "session": self._session, "request": self._rid}
        result = await self._hooks.gate("before_connect", self._rid, payload)
        if result.action == "block":
            from ..egress import Verdict

            return Verdict(False, f"hook:{result.hook_id}", result.reason or f"blocked by hook {result.hook_id}")
        return None

    def refused(self, attempt: Attempt, verdict: Verdict) -> None:
        """Tell the peer (the command's stderr has the proxy's own answer)."""
        where = f"{attempt.host}:{attempt.port}" if ":" not in attempt.host else f"[{attempt.host}]:{attempt.port}"
        self._sink.log(
            pb.LOG_LEVEL_WARN, f"egress refused: {where}: {verdict.reason}", self._rid,
            {"reason": EGRESS_REFUSED, "host": attempt.host, "port": str(attempt.port), "rule": verdict.rule},
        )

    def closed(self, record: Record) -> None:
        """One audit line per connection, allowed or not."""
        fields: dict[str, Any] = {
            "session": self._session, "peer": self._peer, "request_id": self._rid, "host": record.attempt.host,
            "port": record.attempt.port, "via": record.attempt.via, "address": record.address,
            "allowed": record.verdict.allowed, "rule": record.verdict.rule,
            "bytes_up": record.bytes_up, "bytes_down": record.bytes_down,
        }
        if not record.verdict.allowed:
            fields["reason"] = record.verdict.reason
        log_fields(_audit, logging.INFO, "egress", fields)


class RequestEgress:
    """One sandboxed process's egress, from its socketpair to its served listener.

    Its life: made before the spawn (:attr:`child_fd` goes to the sandbox program), :meth:`follow`
    once the process runs (the listener is received and served), :meth:`close` when the process
    ended (or did not start): the listener and every connection through it are closed.
    """

    def __init__(self, proxy: EgressProxy, policy: EgressPolicy, observer: RequestObserver) -> None:
        self._proxy = proxy
        self._policy = policy
        self._observer = observer
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ours.setblocking(False)
        self._served: Served | None = None
        self._reading = False
        self._closed = False

    @property
    def child_fd(self) -> int:
        """The sandbox program's end (``--egress-fd``)."""
        return self._theirs.fileno()

    def environment(self) -> dict[str, str]:
        """The command's proxy variables and secret placeholders (:func:`proxy_environment`)."""
        return proxy_environment(self._policy.placeholders())

    def redacting(self, on_output: Callable[[int, bytes], None]
                  ) -> tuple[Callable[[int, bytes], None], Callable[[int], None] | None]:
        """``on_output`` with every real secret value replaced by ``[secret NAME]`` (a command that
        echoes what a host sent back, or found the value elsewhere), and the stream-end call that
        gives out what was held back: a value split across two reads is held until it is whole
        (:class:`~smith_fast.egress.redacting.StreamRedactor`, one per stream). Without secrets
        ``on_output`` itself and None: the output path is not touched."""
        if not self._policy.secrets:
            return on_output, None
        from ..egress.redacting import StreamRedactor

        pairs = tuple((s.value.encode(), f"[secret {s.name}]".encode()) for s in self._policy.secrets)
        streams: dict[int, StreamRedactor] = {}

        def redacted(fd: int, data: bytes) -> None:
            redactor = streams.get(fd)
            if redactor is None:
                redactor = streams[fd] = StreamRedactor(pairs)
            data = redactor.feed(data)
            if data:
                on_output(fd, data)

        def ended(fd: int) -> None:
            redactor = streams.pop(fd, None)
            held = redactor.end() if redactor is not None else b""
            if held:
                on_output(fd, held)

        return redacted, ended

    def follow(self, proc: ShellProcess) -> None:
        """The process runs: receive its listener and serve it until the process has ended."""
        self._theirs.close()  # the sandbox program's alone now: EOF if it fails before sending
        loop = asyncio.get_running_loop()
        loop.add_reader(self._ours.fileno(), self._receive)
        self._reading = True
        task = loop.create_task(self._close_after(proc))
        _following.add(task)
        task.add_done_callback(_following.discard)

    async def _close_after(self, proc: ShellProcess) -> None:
        try:
            await proc.wait()
        except BaseException:  # its runner reports how it ended; here it only ends
            pass
        finally:
            self.close()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            asyncio.get_running_loop().remove_reader(self._ours.fileno())

    def _receive(self) -> None:
        try:
            _, fds, _, _ = socket.recv_fds(self._ours, 1, 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            fds = []
        self._stop_reading()
        if not fds:
            return  # the sandbox program failed before it made the listener, and said why on stderr
        listener = socket.socket(fileno=fds[0])
        if self._closed:
            listener.close()
            return
        listener.setblocking(False)
        self._served = self._proxy.serve(listener, self._observer, policy=self._policy)

    def close(self) -> None:
        """Stop serving (idempotent): the listener and its connections are closed."""
        if self._closed:
            return
        self._closed = True
        self._stop_reading()
        self._ours.close()
        self._theirs.close()
        if self._served is not None:
            self._served.close()
            self._served = None
