"""Authenticated, least-privilege NATS for the relay (``smith-fast nats-auth`` and the client side).

Without credentials, anyone who reaches the NATS server can publish a gateway's ``open`` to any
worker (and so run commands there) and subscribe to every session's bytes. This module gives
every gateway and worker an identity of its own, an nkey, with permissions that are exactly the
roles table of the relay (the relay's design, "NATS roles"): a worker can only answer and talk to
gateways as itself, a gateway only open sessions and relay bytes as itself.

* :func:`write_auth` (``smith-fast nats-auth``): a nats-server configuration (one account,
  one nkey user per identity, no anonymous user) and one seed file per identity.
* :func:`add_auth_arguments`, :func:`connect_options`: ``--nats-nkey FILE`` / ``--nats-creds
  FILE`` and the ``nats.connect`` keyword arguments they mean (with the gateway's inbox prefix,
  which its subscribe permission names).
* :func:`warn_without_credentials`: one warning line when a process connects with no credentials.
* :func:`private_paths`: the key files, for the sandbox to hide from commands.

The ``nkeys`` package (the ``nats`` extra) is imported only to make or read a seed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from ..errors import NatsCredentialError
from ..logs import get_logger
from ..options import HelpFormatter

__all__ = [
    "DENIED",
    "ROLES",
    "ConnectOptions",
    "Identity",
    "add_auth_arguments",
    "add_parser",
    "connect_options",
    "permissions",
    "private_paths",
    "read_seed",
    "render_config",
    "run",
    "warn_without_credentials",
    "write_auth",
]

log = get_logger("smith_fast.nats.auth")

ROLES: tuple[str, ...] = ("gateway", "worker")
DENIED: tuple[str, ...] = ("$JS.>", "$KV.>", "$SYS.>")
"""Used by nobody in the relay (core NATS only): denied to every identity, whatever else it may do."""

ACCOUNT = "SMITH"
DEFAULT_PORT = 4222
CONFIG_NAME = "nats.conf"
_ID = re.compile(r"^[A-Za-z0-9_-]+$")  # the relay's ids: one subject token each
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_KEY_NAME = re.compile(r"^(gateway|worker)-([A-Za-z0-9_-]+)\.nk$")
_SECRET_ENV = ("SMITH_NATS_USER", "SMITH_NATS_PASSWORD", "SMITH_NATS_TOKEN")
# A key file anyone but its owner can read (or replace) is a key others may hold: refused, as ssh does.
_TOO_OPEN = 0o077


@dataclasses.dataclass(frozen=True)
class Identity:
    """One gateway or worker: the subjects it may use follow from its role and id."""

    role: str
    id: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if not _ID.match(self.id):
            raise ValueError(f"{self.role} id {self.id!r} may hold only letters, digits, '-' and '_'")

    @property
    def key_file(self) -> str:
        """The name of its seed file: ``<role>-<id>.nk``."""
        return f"{self.role}-{self.id}.nk"


class Permissions(TypedDict):
    """What one identity may publish and subscribe to (nats-server's ``permissions`` block)."""

    publish: list[str]
    subscribe: list[str]
    allow_responses: bool


def permissions(identity: Identity, prefix: str = "smith") -> Permissions:
    """The allow-lists of ``identity``: the relay's roles table, with ``prefix`` for ``P``.

    A worker may also ask the other workers about their background processes (publish
    ``P.ps.*``, its answers on ``_INBOX.<id>.>``) and hear their announcements (``P.presence``),
    so that its sessions see the fleet's background processes as ``serve``'s sessions see the
    service's (smith_fast.nats.processes). So a compromised worker can list every worker's
    background processes (their commands, pids, retained output) and cancel them, write their
    stdin and resize their terminals. That is accepted: it is what any session of ``serve``
    granted ``shell_exec`` may do to any background process of its service, and such a worker
    already runs every command of the sessions placed on it. It still cannot start anything on
    another worker nor read another worker's sessions (no ``P.s.*``: a session is opened there
    with an OPEN on it), nor speak for a gateway or another worker.
    """
    p, i = prefix, identity.id
    if identity.role == "gateway":
        return {
            "publish": [f"{p}.s.*.{i}.>", f"{p}.presence.query", f"{p}.hb.{i}"],
            # nats-py's request inbox is _INBOX.<i>.<nuid>.<token> with inbox_prefix=_INBOX.<i>
            "subscribe": [f"{p}.presence", f"{p}.g.{i}.>", f"_INBOX.{i}.>"],
            "allow_responses": False,
        }
    return {
        # a worker answers requests (ps) only on the reply subject it was given; it asks the
        # others about their background processes, its answers on _INBOX.<i>.> (inbox_prefix)
        # presence.query: at its start, whether a worker with its id runs already (two would both serve)
        "publish": [f"{p}.g.*.{i}.>", f"{p}.presence", f"{p}.presence.query", f"{p}.ps.*"],
        "subscribe": [f"{p}.s.{i}.>", f"{p}.presence.query", f"{p}.hb.*", f"{p}.ps.{i}", f"{p}.presence", f"_INBOX.{i}.>"],
        "allow_responses": True,
    }


def _quoted(items: Iterable[str]) -> str:
    # Always quoted: an unquoted $JS.> would be read as a variable reference by nats-server.
    return ", ".join(f'"{item}"' for item in items)


def render_config(
    users: Sequence[tuple[Identity, str]],
    *,
    prefix: str = "smith",
    port: int = DEFAULT_PORT,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> str:
    """The nats-server configuration of ``users`` (identity, public nkey ``U...``).

    One account holds everyone; there is no ``no_auth_user``, so a client without a key is refused.
    """
    denied = _quoted(DENIED)
    lines = [
        "# Written by `smith-fast nats-auth`: one nkey user per gateway and worker, each with only the",
        "# subjects of its role (the relay's roles table). No anonymous user: a client without a key is",
        "# refused. Start with: nats-server -c nats.conf",
        f"port: {port}",
    ]
    if tls_cert is not None and tls_key is not None:
        lines += ["tls {", f'  cert_file: "{tls_cert}"', f'  key_file: "{tls_key}"', "}"]
    lines += ["accounts {", f"  {ACCOUNT} {{", "    users: ["]
    for identity, public_key in users:
        perms = permissions(identity, prefix)
        lines += [
            f"      # {identity.role} {identity.id}",
            "      {",
            f'        nkey: "{public_key}"',
            "        permissions: {",
            f"          publish: {{ allow: [{_quoted(perms['publish'])}], deny: [{denied}] }}",
            f"          subscribe: {{ allow: [{_quoted(perms['subscribe'])}], deny: [{denied}] }}",
        ]
        if perms["allow_responses"]:
            lines.append("          allow_responses: true")
        lines += ["        }", "      }"]
    lines += ["    ]", "  }", "}", ""]
    return "\n".join(lines)


# ---- key files ---------------------------------------------------------------------------------


def _check_private(path: str, what: str) -> os.stat_result:
    """Stat ``path`` (a key file) and refuse it when it is no regular file or others may read it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise NatsCredentialError(f"{what} {path}: cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise NatsCredentialError(f"{what} {path}: not a regular file")
    if st.st_mode & _TOO_OPEN:
        raise NatsCredentialError(
            f"{what} {path}: other users may read it (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"a key others can read is not a secret: chmod 600 {path}"
        )
    return st


def _read_private(path: str, what: str) -> bytes:
    _check_private(path, what)
    try:
        with open(path, "rb") as f:
            return f.read(64 * 1024)  # a seed is 58 bytes, a creds file a few KiB
    except OSError as exc:
        raise NatsCredentialError(f"{what} {path}: cannot be read: {exc.strerror or exc}") from None


def read_seed(path: str, what: str = "--nats-nkey") -> str:
    """The public key (``U...``) of the user seed in ``path``, after checking the file is private.

    Raises:
        NatsCredentialError: the file cannot be read, others may read it, or it holds no user seed.
    """
    import nkeys

    seed = bytearray(_read_private(path, what).strip())
    try:
        prefix, _ = nkeys.decode_seed(bytes(seed))
        if prefix != nkeys.PREFIX_BYTE_USER:
            raise NatsCredentialError(f"{what} {path}: holds an nkey seed, but not a user's (it should start with SU)")
        pair = nkeys.from_seed(seed)
        public = pair.public_key.decode()
        pair.wipe()
        return public
    except nkeys.NkeysError:
        raise NatsCredentialError(f"{what} {path}: not an nkey seed (written by smith-fast nats-auth, starting with SU)") from None
    finally:
        seed[:] = bytes(len(seed))  # best effort: the secret does not linger in this buffer


def _new_seed() -> bytes:
    import nkeys

    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def _write_file(directory: Path, name: str, data: bytes, mode: int) -> Path:
    """Write ``directory/name`` whole or not at all (a temporary file renamed into place), ``mode`` from the start."""
    target = directory / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)  # mkstemp: 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def _private_dir(out: Path) -> None:
    """Make ``out`` mode 0700, or refuse an existing one that other users may enter."""
    if out.exists() and not out.is_dir():
        raise NatsCredentialError(f"--out {out}: exists and is not a directory")
    if not out.exists():
        try:
            out.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise NatsCredentialError(f"--out {out}: cannot be created: {exc.strerror or exc}") from None
        os.chmod(out, 0o700)  # mkdir's mode goes through the umask; this one does not
        return
    mode = stat.S_IMODE(out.stat().st_mode)
    if mode & _TOO_OPEN:
        raise NatsCredentialError(
            f"--out {out}: other users may enter it (mode {mode:04o}) and the seed files go there: "
            f"chmod 700 {out}, or give a new directory"
        )


def _server_file(path: str, flag: str) -> str:
    full = os.path.abspath(path)
    if any(c in full for c in '"\\\n'):
        raise NatsCredentialError(f"{flag} {path}: a path with a quote, backslash or newline cannot be written in nats.conf")
    try:
        with open(full, "rb"):
            pass
    except OSError as exc:
        raise NatsCredentialError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None
    return full


def write_auth(
    out: Path,
    gateways: Sequence[str],
    workers: Sequence[str],
    *,
    prefix: str = "smith",
    port: int = DEFAULT_PORT,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> list[Path]:
    """Write ``out/nats.conf`` and ``out/<role>-<id>.nk`` (mode 0600) for every identity.

    A seed file already there is kept (its key goes into the configuration): running it again
    with one more worker adds that worker and leaves the others' keys as they were deployed.

    Returns:
        The files written, ``nats.conf`` first.

    Raises:
        NatsCredentialError, ValueError: an id, the prefix, the port or a file is unusable.
    """
    if not gateways or not workers:
        raise ValueError("at least one gateway and one worker are needed (--gateways ID,... --workers ID,...)")
    if not _PREFIX.match(prefix):
        raise ValueError(f"--prefix {prefix!r} must be dot-separated tokens of letters, digits, '-' and '_'")
    if not 0 < port < 65536:
        raise ValueError(f"--port {port}: not a TCP port (1-65535)")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    identities = [Identity("gateway", g) for g in gateways] + [Identity("worker", w) for w in workers]
    seen: set[Identity] = set()
    for identity in identities:
        if identity in seen:
            raise ValueError(f"{identity.role} {identity.id} is named twice")
        seen.add(identity)
    cert = _server_file(tls_cert, "--tls-cert") if tls_cert is not None else None
    key = _server_file(tls_key, "--tls-key") if tls_key is not None else None
    _private_dir(out)
    users: list[tuple[Identity, str]] = []
    written: list[Path] = []
    for identity in identities:
        path = out / identity.key_file
        if not path.exists():
            written.append(_write_file(out, identity.key_file, _new_seed() + b"\n", 0o600))
        users.append((identity, read_seed(str(path), "seed file")))
    config = render_config(users, prefix=prefix, port=port, tls_cert=cert, tls_key=key)
    # 0644: it holds public keys only, and the server may run as another user
    return [_write_file(out, CONFIG_NAME, config.encode(), 0o644), *written]


# ---- the client side ---------------------------------------------------------------------------


class ConnectOptions(TypedDict, total=False):
    """The ``nats.connect`` keyword arguments of :func:`connect_options`; none of them is
    ``user``/``password``/``token``, so they merge with ``NatsConfig.credentials()``."""

    nkeys_seed: str
    user_credentials: str
    inbox_prefix: str


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--nats-nkey FILE`` and ``--nats-creds FILE`` (one or the other) to a gateway's or worker's parser."""
    group = parser.add_argument_group("NATS identity (files mode 0600; the sandbox hides them from commands)")
    one = group.add_mutually_exclusive_group()
    one.add_argument("--nats-nkey", metavar="FILE",
                     help="this process's nkey seed, written by `smith-fast nats-auth` (<role>-<id>.nk)")
    one.add_argument("--nats-creds", metavar="FILE",
                     help="a NATS credentials file (user JWT and seed, e.g. from nsc), for servers in operator mode")


def _files(source: object) -> tuple[str | None, str | None]:
    # A parsed Namespace names them nats_nkey/nats_creds; a configuration object may say nkey/creds.
    nkey = getattr(source, "nats_nkey", None) or getattr(source, "nkey", None)
    creds = getattr(source, "nats_creds", None) or getattr(source, "creds", None)
    return (str(nkey) if nkey else None, str(creds) if creds else None)


def _check_creds(path: str) -> None:
    text = _read_private(path, "--nats-creds")
    if b"BEGIN NATS USER JWT" not in text or b"BEGIN USER NKEY SEED" not in text:
        raise NatsCredentialError(f"--nats-creds {path}: not a NATS credentials file (a user JWT and an NKEY SEED block)")


def key_identity(nkey: str | None) -> tuple[str, str] | None:
    """``(role, id)`` a key file's name says (``worker-w1.nk``), or None."""
    match = _KEY_NAME.match(os.path.basename(nkey)) if nkey else None
    return (match.group(1), match.group(2)) if match else None


def connect_options(
    source: object,
    *,
    role: str | None = None,
    identity: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ConnectOptions:
    """The ``nats.connect`` keyword arguments of ``--nats-nkey``/``--nats-creds`` in ``source``.

    Use them beside ``NatsConfig.credentials()`` (they never overlap): ``nats.connect(servers,
    **config.credentials(), **connect_options(args, role="gateway", identity=gateway_id))``.

    Args:
        source: the parsed arguments (``nats_nkey``, ``nats_creds``, ``command``, ``gateway_id``)
            or any object with ``nkey``/``creds`` attributes.
        role: ``gateway`` or ``worker`` (default ``source.command``).
        identity: the gateway's or worker's id (default, for a gateway, ``source.gateway_id``, else
            the id in a key file named ``gateway-<id>.nk``).
        environ: where ``SMITH_NATS_USER``/``PASSWORD``/``TOKEN`` are looked for (default ``os.environ``).

    Returns:
        ``nkeys_seed`` or ``user_credentials`` (the path), and for a gateway ``inbox_prefix``
        ``_INBOX.<id>``: its subscribe permission is ``_INBOX.<id>.>``, so nats-py's default
        ``_INBOX.<random>`` replies would be refused (a worker sets its own from its id,
        smith_fast.nats.worker).

    Raises:
        NatsCredentialError: a key file is unreadable, open to others, not a key, is another
            identity's, or is given beside a user/password/token from the environment.
    """
    nkey, creds = _files(source)
    role = role or getattr(source, "command", None)
    if identity is None and role == "gateway":
        identity = getattr(source, "gateway_id", None)
    env = os.environ if environ is None else environ
    if nkey and creds:
        raise NatsCredentialError("give --nats-nkey or --nats-creds, not both")
    if (nkey or creds) and any(env.get(name) for name in _SECRET_ENV):
        given = ", ".join(name for name in _SECRET_ENV if env.get(name))
        raise NatsCredentialError(f"{given} and --nats-{'nkey' if nkey else 'creds'} are both given: use one kind of credentials")
    options: ConnectOptions = {}
    if nkey:
        read_seed(nkey)
        named = key_identity(nkey)
        if named is not None and role in ROLES:
            if named[0] != role:
                raise NatsCredentialError(f"--nats-nkey {nkey}: the key of {named[0]} {named[1]}, given to a {role}")
            if identity is not None and named[1] != identity:
                raise NatsCredentialError(
                    f"--nats-nkey {nkey}: the key of {role} {named[1]}, but this {role} is {identity}: "
                    f"its permissions name {named[1]}"
                )
            identity = named[1]
        options["nkeys_seed"] = os.path.abspath(nkey)
    elif creds:
        _check_creds(creds)
        options["user_credentials"] = os.path.abspath(creds)
    if role == "gateway":
        if identity is None:
            if nkey or creds:
                raise NatsCredentialError(
                    "a gateway with a NATS identity needs --gateway-id: its replies come on _INBOX.<id>.>, "
                    "which its permissions name"
                )
        else:
            if not _ID.match(identity):
                raise ValueError(f"gateway id {identity!r} may hold only letters, digits, '-' and '_'")
            options["inbox_prefix"] = f"_INBOX.{identity}"
    return options


def warn_without_credentials(
    servers: Sequence[str], role: str, source: object | None = None, environ: Mapping[str, str] | None = None,
) -> bool:
    """Log one warning that NATS is used without credentials, at a gateway's or worker's start.

    With ``source`` (the parsed arguments) it checks first: no warning when a key file or
    ``SMITH_NATS_USER``/``PASSWORD``/``TOKEN`` is given. Without, the caller has decided.

    Returns:
        Whether it warned.
    """
    if source is not None:
        env = os.environ if environ is None else environ
        if any(_files(source)) or any(env.get(name) for name in _SECRET_ENV):
            return False
    where = ", ".join(servers)
    log.warning(
        f"NATS without credentials: anyone who reaches {where} can run commands on every worker and read every session",
        extra={"fields": {
            "role": role, "servers": list(servers),
            "remedy": "smith-fast nats-auth writes a nats-server configuration and a key per process (--nats-nkey FILE)",
        }},
    )
    return True


def private_paths(args: object) -> list[str]:
    """The key files given in ``args`` (``--nats-nkey``, ``--nats-creds``), absolute: files a
    command must never read (the sandbox hides them), since whoever holds one is that process on NATS."""
    return [os.path.abspath(path) for path in _files(args) if path]


# ---- smith-fast nats-auth ----------------------------------------------------------------------

_EXAMPLES = """examples:
  smith-fast nats-auth --gateways gw1 --workers w1,w2,w3 --out /etc/smith/nats
  smith-fast nats-auth --gateways gw1 --workers w1,w2,w3,w4 --out /etc/smith/nats   # adds w4, keeps the other keys
  smith-fast nats-auth --gateways a,b --workers w1 --out DIR --port 4443 --tls-cert server.pem --tls-key server-key.pem
"""


def _ids(values: list[str]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``nats-auth`` subcommand."""
    p = sub.add_parser(
        "nats-auth",
        help="write a least-privilege nats-server configuration and a key per gateway and worker",
        description="Write DIR/nats.conf (one account, one nkey user per gateway and worker with only the "
        "subjects of its role, no anonymous access, $JS/$KV/$SYS denied) and DIR/<role>-<id>.nk, the seed of "
        "each (mode 0600, DIR mode 0700). Start the server with `nats-server -c DIR/nats.conf`; give each "
        "process its own seed and nothing else: `smith-fast gateway --gateway-id gw1 --nats-nkey "
        "DIR/gateway-gw1.nk`, `smith-fast worker --nats-nkey DIR/worker-w1.nk`. A seed already in DIR is kept: "
        "run it again to add or remove identities (a removed one's seed stays in DIR, no longer let in).",
        epilog=_EXAMPLES, formatter_class=HelpFormatter, allow_abbrev=False,
    )
    p.add_argument("--gateways", action="append", default=[], required=True, metavar="ID,...",
                   help="gateway ids (comma-separated or repeated); each gateway runs with --gateway-id ID")
    p.add_argument("--workers", action="append", default=[], required=True, metavar="ID,...",
                   help="worker ids (comma-separated or repeated)")
    p.add_argument("--out", required=True, metavar="DIR", help="where nats.conf and the seed files go (created mode 0700)")
    p.add_argument("--prefix", default="smith", metavar="PREFIX", help="subject prefix, as the processes' --nats-prefix (default smith)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N", help=f"the server's client port (default {DEFAULT_PORT})")
    p.add_argument("--tls-cert", metavar="PEM", help="the server's TLS certificate: clients must use TLS (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")


def run(args: argparse.Namespace) -> int:
    """``smith-fast nats-auth``: write the files and say which is which; 0 on success.

    Raises:
        NatsCredentialError, ValueError, ImportError: printed as one line by ``smith_fast.cli``.
    """
    gateways, workers = _ids(args.gateways), _ids(args.workers)
    written = write_auth(Path(args.out), gateways, workers, prefix=args.prefix, port=args.port,
                         tls_cert=args.tls_cert, tls_key=args.tls_key)
    config, new = written[0], set(written[1:])
    print(f"wrote {config}")
    for identity in [Identity("gateway", g) for g in gateways] + [Identity("worker", w) for w in workers]:
        path = config.parent / identity.key_file
        print(f"{'new key ' if path in new else 'kept key'} {path}: {identity.role} {identity.id} runs with --nats-nkey {path}")
    print(f"start the server with: nats-server -c {config}")
    return 0
