"""The NATS scale-out's servers, credentials, subject prefix and intervals.

Every field is a ``smith-fast worker``/``gateway`` flag (PROTOCOL.md, "Scale-out over NATS"). The
gateways and their workers must agree on the prefix. Nothing is stored in the server (core NATS
only), so there are no streams, consumers or buckets to configure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import TypedDict

from ..options import add_options, check_key_file, option, values

__all__ = ["NatsConfig", "NatsCredentials", "add_arguments", "from_arguments", "is_token", "retired_flags"]

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # stream, consumer and bucket names, subject tokens
_GROUP = "NATS (gateways and workers must agree on the prefix)"
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
    """Where gateways and workers meet, and how they watch each other.

    Attributes:
        servers: NATS URLs (``nats://HOST:PORT``); the client fails over between them.
        prefix: first token(s) of every subject (smith_fast.nats.relay.Subjects).
        reconnect_wait: seconds between reconnection attempts; the clients never stop trying.
        presence_interval: seconds between a worker's presence announcements; a gateway takes a
            worker silent for three intervals as gone.
        queue_notice: seconds a session may wait for a worker before its frontend gets a
            ``LogEvent`` (``reason=placing``).
        queue_timeout: seconds a session may wait for a worker before it is refused
            (``ERROR_CODE_RESOURCE_EXHAUSTED``, ``reason=no_worker``); 0 = wait for ever.
        tls_ca: PEM file of the CA(s) that signed the NATS servers' certificates (default: the
            system's). Given, or with a ``tls://`` server URL, the connection uses TLS.
        tls_cert, tls_key: PEM client certificate and its key, for servers that verify clients
            (``verify: true`` in their ``tls`` block); the two go together.
        user, password: NATS user credentials (``$SMITH_NATS_USER``, ``$SMITH_NATS_PASSWORD``).
        token: a NATS authentication token (``$SMITH_NATS_TOKEN``). The three come from the
            environment, not flags, so that they never show in a process listing; none of them
            is part of the ``repr``.
        gateway_lease: seconds a worker waits on a silent gateway (no heartbeat) before it drops
            that gateway's connections here (resumable sessions park); 0 = never.
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    prefix: str = "smith"
    reconnect_wait: float = 0.5
    presence_interval: float = option(
        2.0, flag="--presence-interval", unit="seconds", commands=("worker", "gateway"), group=_GROUP,
        help="a worker announces itself this often; one silent for 3 intervals is taken as gone")
    queue_notice: float = option(
        2.0, flag="--queue-notice", unit="seconds", commands=("gateway",), group=_GROUP,
        help="a session waiting this long for a worker to take it gets a LogEvent saying so")
    queue_timeout: float = option(
        30.0, flag="--queue-timeout", unit="seconds", commands=("gateway",), group=_GROUP,
        help="a session no worker took by then is refused (RESOURCE_EXHAUSTED, no_worker); 0 = wait")
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    user: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    gateway_lease: float = option(
        15.0, flag="--gateway-lease", unit="seconds", commands=("worker", "gateway"), group=_GROUP,
        help="a gateway not heard from this long is taken as gone: its connections here are dropped (resumable "
             "sessions park); gateways send a heartbeat every third of it; 0 = never")

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"subject prefix {self.prefix!r} must be dot-separated tokens of letters, digits, '-' and '_'")
        if self.presence_interval <= 0:
            raise ValueError("presence_interval must be positive")
        if self.queue_notice < 0 or self.queue_timeout < 0:
            raise ValueError("queue_notice and queue_timeout must not be negative")
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
            check_key_file(self.tls_key or self.tls_cert, "--nats-tls-key" if self.tls_key else "--nats-tls-cert")  # the key may be in the cert's file
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--nats-tls-cert {self.tls_cert} / --nats-tls-key {self.tls_key}: {exc}") from None
        return context


# Flags of the work-queue scale-out (at-least-once, JetStream) that sessions placed on workers made
# meaningless: still accepted, with a warning, so that an old deployment's command line starts.
_RETIRED = ("--nats-command-stream", "--nats-event-stream", "--nats-journal-stream", "--nats-consumer", "--nats-hooks-bucket",
            "--ack-wait", "--max-deliver", "--duplicate-window", "--nats-storage", "--nats-replicas", "--max-queued-commands",
            "--event-max-age")


def add_arguments(parser: argparse.ArgumentParser, command: str = "worker") -> None:
    """Add the ``--nats`` options of ``smith-fast worker`` or ``smith-fast gateway`` (``command``)."""
    d = NatsConfig()
    g = parser.add_argument_group(_GROUP)
    g.add_argument("--nats", action="append", default=[], metavar="URL",
                   help="NATS server URL (repeatable, or comma-separated; default nats://127.0.0.1:4222); credentials "
                        "come from --nats-nkey/--nats-creds, or $SMITH_NATS_USER and $SMITH_NATS_PASSWORD, or $SMITH_NATS_TOKEN")
    g.add_argument("--nats-prefix", default=d.prefix, metavar="PREFIX", help=f"subject prefix (default {d.prefix})")
    g.add_argument("--nats-tls-ca", metavar="PEM", help="CA certificate(s) of the NATS servers; turns TLS on (default CAs: the system's)")
    g.add_argument("--nats-tls-cert", metavar="PEM", help="client certificate, for NATS servers that verify clients (with --nats-tls-key)")
    g.add_argument("--nats-tls-key", metavar="PEM", help="the client certificate's private key")
    for flag in _RETIRED:
        g.add_argument(flag, dest="retired_" + flag.lstrip("-").replace("-", "_"), metavar="X", help=argparse.SUPPRESS)
    add_options(parser, NatsConfig, command, {_GROUP: g})


def retired_flags(args: argparse.Namespace) -> list[str]:
    """The retired flags given (each is ignored; the caller warns)."""
    return [flag for flag in _RETIRED if getattr(args, "retired_" + flag.lstrip("-").replace("-", "_"), None) is not None]


_SCHEMES = ("nats", "tls", "ws", "wss")


def check_server_url(url: str) -> None:
    """Refuse a ``--nats`` URL no connection can be made to, at start: nats-py took it, failed
    (``invalid connect url option``, a DNS error on ``bogus://x``) and retried it for ever.

    Raises:
        ValueError: not ``[SCHEME://]HOST[:PORT]`` with a scheme of :data:`_SCHEMES` and a port
            from 1 to 65535.
    """
    parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")  # nats-py's own default scheme
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in _SCHEMES or not parts.hostname or port == 0 or port == -1:
        raise ValueError(f"--nats {url}: not a NATS server's URL, SCHEME://HOST[:PORT] with SCHEME {', '.join(_SCHEMES[:-1])} "
                         f"or {_SCHEMES[-1]} and a port from 1 to 65535")


def from_arguments(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> NatsConfig:
    """The :class:`NatsConfig` the options of :func:`add_arguments` describe.

    Credentials come from ``environ`` (default ``os.environ``): ``SMITH_NATS_USER`` and
    ``SMITH_NATS_PASSWORD``, or ``SMITH_NATS_TOKEN``.

    Raises:
        ValueError: a name or limit is invalid.
    """
    servers = tuple(url.strip() for item in args.nats for url in item.split(",") if url.strip())
    for url in servers:
        check_server_url(url)
    env = os.environ if environ is None else environ
    return NatsConfig(
        servers=servers or NatsConfig.servers,
        prefix=args.nats_prefix,
        tls_ca=args.nats_tls_ca,
        tls_cert=args.nats_tls_cert,
        tls_key=args.nats_tls_key,
        user=env.get("SMITH_NATS_USER") or None,
        password=env.get("SMITH_NATS_PASSWORD") or None,
        token=env.get("SMITH_NATS_TOKEN") or None,
        **values(args, NatsConfig, getattr(args, "command", "worker"), env),
    )
