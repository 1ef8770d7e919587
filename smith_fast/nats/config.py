"""Names and limits of the NATS scale-out: subjects, streams, consumer, key-value bucket.

Every field is a ``smith-fast worker``/``gateway`` flag (PROTOCOL.md, "Scale-out over NATS"). The
gateway and all its workers must agree on them; the streams, the consumer and the bucket are
created with these settings when missing and used as they are when they already exist.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import ssl
from collections.abc import Mapping
from typing import TypedDict

from ..options import add_options, format_duration, option, parse_duration, values

__all__ = ["NatsConfig", "NatsCredentials", "add_arguments", "from_arguments", "is_token"]

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # stream, consumer and bucket names, subject tokens
_GROUP = "NATS JetStream (gateway and workers must agree on these)"
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def is_token(name: str) -> bool:
    """Whether ``name`` can be one subject token and a stream, consumer or bucket name."""
    return bool(_NAME.match(name))


class NatsCredentials(TypedDict, total=False):
    """The credential keyword arguments of ``nats.connect``: ``user`` with ``password``, or ``token``."""

    user: str
    password: str
    token: str


@dataclasses.dataclass(frozen=True)
class NatsConfig:
    """Where commands and events travel, and the limits of the streams that carry them.

    Attributes:
        servers: NATS URLs (``nats://HOST:PORT``); the client fails over between them.
        prefix: first token(s) of every subject: ``<prefix>.cmd.…``, ``<prefix>.evt.…``,
            ``<prefix>.ctl.…``.
        command_stream: the work-queue stream of commands (``<prefix>.cmd.>``).
        event_stream: the interest-retention stream of events (``<prefix>.evt.>``).
        journal_stream: the stream a gateway with a fixed ``--gateway-id`` journals its
            resumable sessions' envelopes in (``<prefix>.out.>``; smith_fast.nats.journal).
        worker_consumer: the durable pull consumer every worker shares.
        hooks_bucket: the key-value bucket holding the sources of session hooks.
        ack_wait: seconds a worker may hold a command without a progress report before it is
            delivered to another worker; a live worker reports progress every third of it.
        max_deliver: deliveries of one command before it is given up (the frontend then gets
            ``ERROR_CODE_INTERNAL_ERROR`` with ``details.reason = max_deliveries``).
        duplicate_window: seconds during which a republished message id is dropped by the stream.
        max_commands: commands waiting in the command stream before new ones are refused
            (``ERROR_CODE_RESOURCE_EXHAUSTED``).
        command_max_bytes: bytes the command stream may hold, likewise.
        event_max_bytes: bytes the event stream may hold; the oldest events are dropped beyond it.
        event_max_age: seconds an undelivered event is kept.
        journal_max_bytes, journal_max_age: bounds of the journal stream (the oldest messages go
            first); a session whose journal aged out cannot be taken over by a restarted gateway.
        storage: ``file`` (survives a server restart) or ``memory``.
        replicas: stream replicas (1 on a single server; 3 on a cluster).
        max_ack_pending: commands handed out and not yet acknowledged, across all workers.
        submit_timeout: seconds the gateway keeps trying to store a command while NATS is
            unreachable before the request fails (``details.reason = nats_unavailable``).
        publish_timeout: seconds to wait for the stream's acknowledgement of one publish before
            publishing it again (under the same message id).
        reconnect_wait: seconds between reconnection attempts; the clients never stop trying.
        presence_interval: seconds between a worker's presence announcements; a gateway takes a
            worker silent for three intervals as gone.
        queue_notice: seconds a command may wait for a worker before its frontend gets a
            ``LogEvent`` (``reason=queued``, the queue depth); 0 = no notice.
        queue_timeout: seconds a command may wait for a worker before it is withdrawn and fails
            (``ERROR_CODE_EXECUTION_TIMEOUT``, ``reason=queue_timeout``); 0 = wait for ever.
        tls_ca: PEM file of the CA(s) that signed the NATS servers' certificates (default: the
            system's). Given, or with a ``tls://`` server URL, the connection uses TLS.
        tls_cert, tls_key: PEM client certificate and its key, for servers that verify clients
            (``verify: true`` in their ``tls`` block); the two go together.
        user, password: NATS user credentials (``$SMITH_NATS_USER``, ``$SMITH_NATS_PASSWORD``).
        token: a NATS authentication token (``$SMITH_NATS_TOKEN``). The three come from the
            environment, not flags, so that they never show in a process listing; none of them
            is part of the ``repr``.
        gateway_lease: seconds a worker waits on a silent gateway (no heartbeat) before it ends
            that gateway's sessions here (smith_fast/nats/leases.py); 0 = never.
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    prefix: str = "smith"
    command_stream: str = "SMITH_CMD"
    event_stream: str = "SMITH_EVT"
    journal_stream: str = "SMITH_OUT"
    worker_consumer: str = "smith-workers"
    hooks_bucket: str = "smith-hooks"
    ack_wait: float = 30.0
    max_deliver: int = 5
    duplicate_window: float = 120.0
    max_commands: int = 1_000_000
    command_max_bytes: int = 1 << 30
    event_max_bytes: int = 1 << 30
    event_max_age: float = 3600.0
    journal_max_bytes: int = 1 << 30
    journal_max_age: float = 86400.0
    storage: str = "file"
    replicas: int = 1
    max_ack_pending: int = 10_000
    submit_timeout: float = 60.0
    publish_timeout: float = 5.0
    reconnect_wait: float = 0.5
    presence_interval: float = option(
        2.0, flag="--presence-interval", unit="seconds", commands=("worker", "gateway"), group=_GROUP,
        help="a worker announces itself this often; one silent for 3 intervals is taken as gone")
    queue_notice: float = option(
        2.0, flag="--queue-notice", unit="seconds", commands=("gateway",), group=_GROUP,
        help="a command waiting this long for a worker gets a LogEvent saying it is queued; 0 = never")
    queue_timeout: float = option(
        0.0, flag="--queue-timeout", unit="seconds", commands=("gateway",), group=_GROUP,
        help="a command no worker took by then is withdrawn and fails (EXECUTION_TIMEOUT); 0 = wait")
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    user: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    gateway_lease: float = option(
        120.0, flag="--gateway-lease", unit="seconds", commands=("worker",), group=_GROUP,
        help="a gateway not heard from this long is taken as gone: its sessions' commands here are stopped; 0 = never")

    def __post_init__(self) -> None:
        for name in ("command_stream", "event_stream", "journal_stream", "worker_consumer", "hooks_bucket"):
            if not _NAME.match(getattr(self, name)):
                raise ValueError(f"{name} {getattr(self, name)!r} may hold only letters, digits, '-' and '_'")
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"subject prefix {self.prefix!r} must be dot-separated tokens of letters, digits, '-' and '_'")
        if self.storage not in ("file", "memory"):
            raise ValueError(f"storage must be 'file' or 'memory', not {self.storage!r}")
        if self.ack_wait <= 0 or self.publish_timeout <= 0 or self.submit_timeout <= 0:
            raise ValueError("ack_wait, publish_timeout and submit_timeout must be positive")
        if self.presence_interval <= 0:
            raise ValueError("presence_interval must be positive")
        if self.queue_notice < 0 or self.queue_timeout < 0:
            raise ValueError("queue_notice and queue_timeout must not be negative")
        if self.max_deliver < 1:
            raise ValueError("max_deliver must be at least 1")
        if not self.servers:
            raise ValueError("at least one NATS server URL is needed")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--nats-tls-cert and --nats-tls-key go together")
        if (self.user is None) != (self.password is None):
            raise ValueError("SMITH_NATS_USER and SMITH_NATS_PASSWORD go together")
        if self.token is not None and self.user is not None:
            raise ValueError("give SMITH_NATS_TOKEN or SMITH_NATS_USER/SMITH_NATS_PASSWORD, not both")

    def credentials(self) -> NatsCredentials:
        """The ``user``/``password`` or ``token`` keyword arguments of ``nats.connect`` (may be empty)."""
        if self.token is not None:
            return {"token": self.token}
        if self.user is not None and self.password is not None:
            return {"user": self.user, "password": self.password}
        return {}

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the NATS connections, or None for plain TCP.

        TLS is used when a CA, a client certificate or a ``tls://`` URL is given. Servers are
        verified against ``tls_ca`` (or the system's CAs), host names included.

        Raises:
            ValueError: a file cannot be read or holds no usable certificate or key.
        """
        wanted = self.tls_ca or self.tls_cert or any(url.lower().startswith("tls://") for url in self.servers)
        if not wanted:
            return None
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--nats-tls-ca {self.tls_ca}: {exc}") from None
        if self.tls_cert is not None:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--nats-tls-cert {self.tls_cert} / --nats-tls-key {self.tls_key}: {exc}") from None
        return context

    # ---- subjects ------------------------------------------------------------------------------

    def command_subject(self, gateway: str, session: str) -> str:
        """Where a gateway session's commands go: ``<prefix>.cmd.<gateway>.<session>``."""
        return f"{self.prefix}.cmd.{gateway}.{session}"

    def event_subject(self, gateway: str, session: str) -> str:
        """Where the events of a gateway session's commands go: ``<prefix>.evt.<gateway>.<session>``."""
        return f"{self.prefix}.evt.{gateway}.{session}"

    def journal_subject(self, gateway: str, session: str) -> str:
        """Where a gateway with a fixed id journals a resumable session's envelopes
        (smith_fast.nats.journal): ``<prefix>.out.<gateway>.<session>``."""
        return f"{self.prefix}.out.{gateway}.{session}"

    def journal_filter(self, gateway: str) -> str:
        """The journal subjects of one gateway: ``<prefix>.out.<gateway>.*``."""
        return f"{self.prefix}.out.{gateway}.*"

    def control_subject(self, session: str) -> str:
        """Session control (pause, resume, shutdown, end) for every worker: ``<prefix>.ctl.<session>``."""
        return f"{self.prefix}.ctl.{session}"

    def presence_subject(self) -> str:
        """Where workers announce themselves: ``<prefix>.presence`` (a core NATS subject)."""
        return f"{self.prefix}.presence"

    def presence_query_subject(self) -> str:
        """Where a gateway asks every worker to announce itself now: ``<prefix>.presence.query``."""
        return f"{self.prefix}.presence.query"

    def gateway_consumer(self, gateway: str) -> str:
        """The durable consumer of one gateway's events: ``smith-gw-<gateway>``."""
        return f"smith-gw-{gateway}"

    def gateway_filter(self, gateway: str) -> str:
        """The event subjects of one gateway: ``<prefix>.evt.<gateway>.>``."""
        return f"{self.prefix}.evt.{gateway}.>"


def add_arguments(parser: argparse.ArgumentParser, command: str = "worker") -> None:
    """Add the ``--nats`` options of ``smith-fast worker`` or ``smith-fast gateway`` (``command``)."""
    d = NatsConfig()
    g = parser.add_argument_group(_GROUP)
    g.add_argument("--nats", action="append", default=[], metavar="URL",
                   help="NATS server URL (repeatable, or comma-separated; default nats://127.0.0.1:4222); credentials "
                        "come from $SMITH_NATS_USER and $SMITH_NATS_PASSWORD, or $SMITH_NATS_TOKEN")
    g.add_argument("--nats-prefix", default=d.prefix, metavar="PREFIX", help=f"subject prefix (default {d.prefix})")
    g.add_argument("--nats-command-stream", default=d.command_stream, metavar="NAME", help=f"work-queue stream of commands (default {d.command_stream})")
    g.add_argument("--nats-event-stream", default=d.event_stream, metavar="NAME", help=f"stream of events (default {d.event_stream})")
    g.add_argument("--nats-journal-stream", default=d.journal_stream, metavar="NAME",
                   help=f"stream of the gateway's session journals, kept for its restart (default {d.journal_stream})")
    g.add_argument("--nats-consumer", default=d.worker_consumer, metavar="NAME", help=f"durable consumer shared by the workers (default {d.worker_consumer})")
    g.add_argument("--nats-hooks-bucket", default=d.hooks_bucket, metavar="NAME", help=f"key-value bucket of session hooks (default {d.hooks_bucket})")
    g.add_argument("--ack-wait", type=parse_duration, default=d.ack_wait, metavar="DURATION",
                   help=f"a command held this long without progress goes to another worker (default {format_duration(d.ack_wait)})")
    g.add_argument("--max-deliver", type=int, default=d.max_deliver, metavar="N", help=f"deliveries of one command before it fails (default {d.max_deliver})")
    g.add_argument("--duplicate-window", type=parse_duration, default=d.duplicate_window, metavar="DURATION",
                   help=f"the streams drop a message id seen this recently (default {format_duration(d.duplicate_window)})")
    g.add_argument("--nats-storage", choices=["file", "memory"], default=d.storage, help="stream storage (default file)")
    g.add_argument("--nats-replicas", type=int, default=d.replicas, metavar="N", help="stream replicas (default 1)")
    g.add_argument("--max-queued-commands", type=int, default=d.max_commands, metavar="N",
                   help=f"commands waiting in the stream before new ones are refused (default {d.max_commands})")
    g.add_argument("--event-max-age", type=parse_duration, default=d.event_max_age, metavar="DURATION",
                   help=f"undelivered events are dropped after this long (default {format_duration(d.event_max_age)})")
    g.add_argument("--nats-tls-ca", metavar="PEM", help="CA certificate(s) of the NATS servers; turns TLS on (default CAs: the system's)")
    g.add_argument("--nats-tls-cert", metavar="PEM", help="client certificate, for NATS servers that verify clients (with --nats-tls-key)")
    g.add_argument("--nats-tls-key", metavar="PEM", help="the client certificate's private key")
    add_options(parser, NatsConfig, command, {_GROUP: g})


def from_arguments(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> NatsConfig:
    """The :class:`NatsConfig` the options of :func:`add_arguments` describe.

    Credentials come from ``environ`` (default ``os.environ``): ``SMITH_NATS_USER`` and
    ``SMITH_NATS_PASSWORD``, or ``SMITH_NATS_TOKEN``.

    Raises:
        ValueError: a name or limit is invalid.
    """
    servers = tuple(url.strip() for item in args.nats for url in item.split(",") if url.strip())
    env = os.environ if environ is None else environ
    return NatsConfig(
        servers=servers or NatsConfig.servers,
        prefix=args.nats_prefix,
        command_stream=args.nats_command_stream,
        event_stream=args.nats_event_stream,
        journal_stream=args.nats_journal_stream,
        worker_consumer=args.nats_consumer,
        hooks_bucket=args.nats_hooks_bucket,
        ack_wait=args.ack_wait,
        max_deliver=args.max_deliver,
        duplicate_window=args.duplicate_window,
        storage=args.nats_storage,
        replicas=args.nats_replicas,
        max_commands=args.max_queued_commands,
        event_max_age=args.event_max_age,
        tls_ca=args.nats_tls_ca,
        tls_cert=args.nats_tls_cert,
        tls_key=args.nats_tls_key,
        user=env.get("SMITH_NATS_USER") or None,
        password=env.get("SMITH_NATS_PASSWORD") or None,
        token=env.get("SMITH_NATS_TOKEN") or None,
        **values(args, NatsConfig, getattr(args, "command", "worker"), env),
    )
