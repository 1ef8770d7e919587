"""Least-privilege NATS for the relay (smith_fast/nats/auth.py) against a real nats-server.

``smith-fast nats-auth`` writes the server's configuration and one nkey seed per gateway and
worker; the server is started on that configuration and nats-py clients, each with one identity's
seed (through ``connect_options``), try what the roles table allows and what it does not: nobody
gets in without a key, a worker cannot speak for another worker nor read a gateway's bytes, a
gateway cannot read another gateway's replies nor send as it, nobody reaches JetStream or the
system account. nats-py reports the server's refusals ("Permissions Violation ...") to the error
callback, the connection staying open; a refused message is also checked not to arrive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from harness.nats_cluster import NatsServer, nats_server_binary
from harness.server import ROOT, ServerProcess, assert_clean_log
from smith_fast.errors import NatsCredentialError
from smith_fast.nats import auth
from smith_fast.pb import smith_pb2 as pb
from smith_fast.refused_env import refused_names

from .peers import V1Peer, errors, terminal

CLI = [sys.executable, "-m", "smith_fast"]
GATEWAYS = ("G1", "G2")
WORKERS = ("W1", "W2")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


def nats_auth(out: pathlib.Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("nats-auth", "--gateways", ",".join(GATEWAYS), "--workers", ",".join(WORKERS), "--out", str(out), *extra)


def check_config(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """nats-server's own check of a configuration file (``-t``)."""
    return subprocess.run([nats_server_binary(), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30)


# ---- smith-fast nats-auth --------------------------------------------------------------------------


def test_nats_auth_writes_a_config_the_server_accepts_and_private_seeds(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "auth"
    result = nats_auth(out)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    names = sorted(p.name for p in out.iterdir())
    assert names == ["gateway-G1.nk", "gateway-G2.nk", "nats.conf", "worker-W1.nk", "worker-W2.nk"]
    for name in names[:2] + names[3:]:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
        assert (out / name).read_text().startswith("SU"), name
    checked = check_config(out / "nats.conf")
    assert checked.returncode == 0 and "is valid" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    text = (out / "nats.conf").read_text()
    assert "no_auth_user" not in text and "allow_responses: true" in text
    # each identity's public key is in the configuration, under its own comment
    for name in names:
        if name.endswith(".nk"):
            public = auth.read_seed(str(out / name))
            role, ident = name[:-3].split("-")
            assert text.index(f"# {role} {ident}") < text.index(public), name
    assert f"{out}/worker-W1.nk" in result.stdout and "nats-server -c" in result.stdout


def test_nats_auth_again_keeps_the_keys_and_adds_new_identities(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "auth"
    assert nats_auth(out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.glob("*.nk")}
    result = cli("nats-auth", "--gateways", "G1,G2", "--workers", "W1", "--workers", "W2,W3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    after = {p.name: p.read_bytes() for p in out.glob("*.nk")}
    assert {k: after[k] for k in before} == before and set(after) - set(before) == {"worker-W3.nk"}
    assert "new key  " in result.stdout and result.stdout.count("kept key") == 4
    assert auth.read_seed(str(out / "worker-W3.nk")) in (out / "nats.conf").read_text()
    assert check_config(out / "nats.conf").returncode == 0


def test_nats_auth_with_tls_and_a_port(tmp_path: pathlib.Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    out = tmp_path / "auth"
    result = nats_auth(out, "--port", "4443", "--prefix", "corp.smith", "--tls-cert", str(tmp_path / "cert.pem"),
                       "--tls-key", str(tmp_path / "key.pem"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = (out / "nats.conf").read_text()
    assert "port: 4443" in text and f'cert_file: "{tmp_path}/cert.pem"' in text and '"corp.smith.s.*.G1.>"' in text
    assert check_config(out / "nats.conf").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gateways", "G1", "--workers", "w.1"), "worker id 'w.1' may hold only letters"),
        (("--gateways", "G1", "--workers", "W1,W1"), "worker W1 is named twice"),
        (("--gateways", "G1", "--workers", "W1", "--prefix", "a..b"), "--prefix 'a..b'"),
        (("--gateways", "G1", "--workers", "W1", "--port", "70000"), "--port 70000"),
        (("--gateways", "G1", "--workers", "W1", "--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"),
         "--tls-cert /nonexistent/c.pem: cannot be read"),
        (("--gateways", "G1", "--workers", "W1", "--tls-cert", "c.pem"), "--tls-cert and --tls-key go together"),
    ],
)  # fmt: skip
def test_nats_auth_refuses_bad_input_in_one_line(tmp_path: pathlib.Path, args: tuple[str, ...], message: str) -> None:
    result = cli("nats-auth", *args, "--out", str(tmp_path / "auth"))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "auth").exists()  # nothing written


def test_nats_auth_refuses_an_open_directory_and_an_open_seed(tmp_path: pathlib.Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    result = nats_auth(open_dir)
    assert result.returncode == 2 and f"--out {open_dir}: other users may enter it (mode 0755)" in result.stderr, result.stderr
    assert list(open_dir.iterdir()) == []
    out = tmp_path / "auth"
    assert nats_auth(out).returncode == 0
    (out / "worker-W1.nk").chmod(0o644)
    result = nats_auth(out)
    assert result.returncode == 2 and f"{out}/worker-W1.nk: other users may read it (mode 0644)" in result.stderr, result.stderr
    assert "chmod 600" in result.stderr and "Traceback" not in result.stderr


def test_nats_auth_help_has_examples() -> None:
    result = cli("nats-auth", "--help")
    assert result.returncode == 0 and "usage: smith-fast nats-auth" in result.stdout
    head, _, examples = result.stdout.rpartition("\nexamples:\n")
    lines = [line.strip() for line in examples.splitlines() if line.strip()]
    assert 2 <= len(lines) <= 4 and all(line.startswith("smith-fast nats-auth") for line in lines), lines
    text = " ".join(head.split())
    for flag in ("--gateways", "--workers", "--out", "--prefix", "--port", "--tls-cert", "--tls-key", "--nats-nkey DIR/worker-w1.nk"):
        assert flag in text, flag


# ---- the client side: key files, connect options ---------------------------------------------------


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("keys") / "auth"
    result = nats_auth(out)
    assert result.returncode == 0, result.stderr
    return out


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("command")
    parser.add_argument("--gateway-id")
    auth.add_auth_arguments(parser)
    return parser.parse_args(list(argv))


def test_connect_options_of_a_gateway_and_a_worker(keys: pathlib.Path) -> None:
    gw = str(keys / "gateway-G1.nk")
    assert auth.connect_options(_args("gateway", "--gateway-id", "G1", "--nats-nkey", gw), environ={}) == {
        "nkeys_seed": gw, "inbox_prefix": "_INBOX.G1",
    }  # fmt: skip
    # the id comes from the key's name when --gateway-id is not given
    assert auth.connect_options(_args("gateway", "--nats-nkey", gw), environ={})["inbox_prefix"] == "_INBOX.G1"
    assert auth.connect_options(_args("worker", "--nats-nkey", str(keys / "worker-W2.nk")), environ={}) == {
        "nkeys_seed": str(keys / "worker-W2.nk"),
    }  # fmt: skip
    # no key: nothing but the inbox a gateway's permissions would name
    assert auth.connect_options(_args("worker"), environ={}) == {}
    assert auth.connect_options(_args("gateway", "--gateway-id", "G9"), environ={}) == {"inbox_prefix": "_INBOX.G9"}
    assert auth.private_paths(_args("worker", "--nats-nkey", os.path.relpath(keys / "worker-W1.nk"))) == [str(keys / "worker-W1.nk")]
    assert auth.private_paths(_args("worker")) == []


def test_connect_options_refuse_what_would_fail_later(keys: pathlib.Path, tmp_path: pathlib.Path) -> None:
    def refused(args: argparse.Namespace, message: str, environ: dict[str, str] | None = None) -> None:
        with pytest.raises(NatsCredentialError) as caught:
            auth.connect_options(args, environ=environ or {})
        assert message in str(caught.value)

    gw, w1 = str(keys / "gateway-G1.nk"), str(keys / "worker-W1.nk")
    refused(_args("gateway", "--gateway-id", "G2", "--nats-nkey", gw), "the key of gateway G1, but this gateway is G2")
    refused(_args("gateway", "--gateway-id", "W1", "--nats-nkey", w1), "the key of worker W1, given to a gateway")
    refused(_args("worker", "--nats-nkey", w1), "SMITH_NATS_TOKEN and --nats-nkey are both given", {"SMITH_NATS_TOKEN": "t"})
    missing = str(tmp_path / "none.nk")
    refused(_args("worker", "--nats-nkey", missing), f"--nats-nkey {missing}: cannot be read")
    open_copy = tmp_path / "open.nk"
    open_copy.write_bytes((keys / "worker-W1.nk").read_bytes())
    open_copy.chmod(0o640)
    refused(_args("worker", "--nats-nkey", str(open_copy)), f"--nats-nkey {open_copy}: other users may read it (mode 0640)")
    junk = tmp_path / "junk.nk"
    junk.write_text("not a seed\n")
    junk.chmod(0o600)
    refused(_args("worker", "--nats-nkey", str(junk)), f"--nats-nkey {junk}: not an nkey seed")
    refused(_args("worker", "--nats-creds", str(junk)), f"--nats-creds {junk}: not a NATS credentials file")
    # a creds file elsewhere than the key's name: the gateway must say which it is
    creds = tmp_path / "gw.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n-----BEGIN USER NKEY SEED-----\nSU\n------END USER NKEY SEED------\n")
    creds.chmod(0o600)
    refused(_args("gateway", "--nats-creds", str(creds)), "a gateway with a NATS identity needs --gateway-id")
    assert auth.connect_options(_args("gateway", "--gateway-id", "G1", "--nats-creds", str(creds)), environ={}) == {
        "user_credentials": str(creds), "inbox_prefix": "_INBOX.G1",
    }  # fmt: skip
    with pytest.raises(argparse.ArgumentError, match="not allowed with"):
        _args("worker", "--nats-nkey", w1, "--nats-creds", str(creds))


def test_warn_without_credentials_is_one_json_line(keys: pathlib.Path) -> None:
    code = (
        "import argparse, sys; from smith_fast.logs import configure; configure('info'); "
        "from smith_fast.nats.auth import warn_without_credentials as warn; "
        "ns = argparse.Namespace(nats_nkey=sys.argv[1], nats_creds=None); "
        "assert warn(['nats://a:4222', 'nats://b:4222'], 'worker', argparse.Namespace(), {}); "
        "assert not warn(['nats://a:4222'], 'worker', ns, {}); "
        "assert not warn(['nats://a:4222'], 'gateway', argparse.Namespace(), {'SMITH_NATS_TOKEN': 't'})"
    )
    result = subprocess.run([sys.executable, "-c", code, str(keys / "worker-W1.nk")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "warning" and record["role"] == "worker"
    assert record["event"] == ("NATS without credentials: anyone who reaches nats://a:4222, nats://b:4222 can run commands "
                               "on every worker and read every session")  # fmt: skip


# ---- the server on the generated configuration -----------------------------------------------------


@pytest.fixture(scope="module")
def server(keys: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    srv = NatsServer(tmp_path_factory.mktemp("nats") / "store", extra=("-c", str(keys / "nats.conf"))).start()
    yield srv
    srv.stop()


class Peer:
    """One nats-py connection as one identity, with the server's refusals it was told of."""

    def __init__(self, nc: NATS, refusals: list[str]) -> None:
        self.nc = nc
        self.refusals = refusals

    async def refused(self, what: str, subject: str) -> None:
        """Wait for the server's "Permissions Violation for <what> to <subject>" (nats-py lower-cases it)."""
        wanted = f'permissions violation for {what} to "{subject}"'.lower()
        for _ in range(100):
            if any(wanted in r for r in self.refusals):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"no refusal {wanted!r}; got {self.refusals}")


Connect = Callable[[str, str], Awaitable[Peer]]


@pytest.fixture
async def connect(server: NatsServer, keys: pathlib.Path) -> AsyncIterator[Connect]:
    opened: list[NATS] = []

    async def open_as(role: str, ident: str) -> Peer:
        refusals: list[str] = []

        async def on_error(exc: Exception) -> None:
            refusals.append(str(exc).lower())

        args = _args(role, "--nats-nkey", str(keys / f"{role}-{ident}.nk"))
        options = dict(auth.connect_options(args, identity=ident, environ={}))
        if role == "worker":
            options["inbox_prefix"] = f"_INBOX.{ident}"  # as smith_fast.nats.worker sets it
        nc = await nats.connect(server.url, error_cb=on_error, allow_reconnect=False, connect_timeout=5, **options)
        opened.append(nc)
        return Peer(nc, refusals)

    yield open_as
    for nc in opened:
        await nc.close()


async def _receiver(peer: Peer, subject: str) -> asyncio.Queue[Msg]:
    box: asyncio.Queue[Msg] = asyncio.Queue()

    async def put(msg: Msg) -> None:
        box.put_nowait(msg)

    await peer.nc.subscribe(subject, cb=put)
    await peer.nc.flush()
    return box


async def test_anonymous_and_unknown_keys_are_refused(server: NatsServer, tmp_path: pathlib.Path) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)
    # a valid user key the server was never told of
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(auth._new_seed())
    stranger.chmod(0o600)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5, nkeys_seed=str(stranger))


async def test_gateway_opens_a_session_on_a_worker_and_bytes_flow_both_ways(connect: Connect) -> None:
    gateway, worker = await connect("gateway", "G1"), await connect("worker", "W1")
    to_worker = await _receiver(worker, "smith.s.W1.>")

    async def announce(msg: Msg) -> None:
        await worker.nc.publish("smith.presence", b'{"worker":"W1"}')

    await worker.nc.subscribe("smith.presence.query", cb=announce)
    to_gateway = await _receiver(gateway, "smith.g.G1.>")
    presence = await _receiver(gateway, "smith.presence")
    await worker.nc.flush()
    # the gateway's OPEN and the frontend's bytes on the connection's subject; the worker's answer
    # and the session's bytes on the gateway's
    await gateway.nc.publish("smith.s.W1.G1.C1", b"\x01\x07{}")
    await gateway.nc.publish("smith.s.W1.G1.C1", b"\x02\x01frontend")
    await worker.nc.publish("smith.g.G1.W1.C1", b"\x01\x08{}")
    await worker.nc.publish("smith.g.G1.W1.C1", b"\x02\x01session")
    await gateway.nc.publish("smith.presence.query", b"")
    assert [(await asyncio.wait_for(to_worker.get(), 5)).data for _ in range(2)] == [b"\x01\x07{}", b"\x02\x01frontend"]
    assert [(await asyncio.wait_for(to_gateway.get(), 5)).data for _ in range(2)] == [b"\x01\x08{}", b"\x02\x01session"]
    assert (await asyncio.wait_for(presence.get(), 5)).data == b'{"worker":"W1"}'
    assert gateway.refusals == [] and worker.refusals == []


async def test_a_worker_cannot_speak_for_another_worker_nor_read_a_gateway(connect: Connect) -> None:
    w1, w2, gateway = await connect("worker", "W1"), await connect("worker", "W2"), await connect("gateway", "G1")
    w2_sessions = await _receiver(w2, "smith.s.W2.>")
    g1_bytes = await _receiver(gateway, "smith.g.G1.>")
    # W1 feeding (or opening) a session on W2, posing as W2 towards a gateway
    await w1.nc.publish("smith.s.W2.G1.x", b"forged")
    await w1.refused("publish", "smith.s.W2.G1.x")
    await w1.nc.publish("smith.g.G1.W2.C1", b"forged")
    await w1.refused("publish", "smith.g.G1.W2.C1")
    # nor can it read what a gateway is sent, W2's sessions, or answer a request it was not sent
    await w1.nc.subscribe("smith.g.G1.>")
    await w1.refused("subscription", "smith.g.G1.>")
    await w1.nc.subscribe("smith.s.W2.>")
    await w1.refused("subscription", "smith.s.W2.>")
    await w1.nc.publish("_INBOX.G1.forged.1", b"forged")
    await w1.refused("publish", "_INBOX.G1.forged.1")
    await asyncio.sleep(0.2)
    assert w2_sessions.empty() and g1_bytes.empty()
    assert w1.nc.is_connected  # refused, not disconnected


async def _request_once_heard(nc: Any, subject: str, data: bytes) -> Msg:
    """A request to a subscription another connection has just made: its flush means nats-server
    has it, yet under load the asker's request was seen to find no responder (NoRespondersError, 2
    runs in 10) a moment after: "no responders" is retried for up to 5 s, any other answer is final."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        try:
            return await nc.request(subject, data, timeout=5)
        except NoRespondersError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_a_worker_asks_another_about_its_background_processes_and_reads_only_its_own_answers(connect: Connect) -> None:
    """Workers see each other's background processes (smith_fast.nats.processes): W1 asks on
    smith.ps.W2 and gets W2's answer on its own inbox, and hears W2's announcements; it cannot
    take W2's requests nor read the answers W2 is sent."""
    w1, w2 = await connect("worker", "W1"), await connect("worker", "W2")
    w1_presence = await _receiver(w1, "smith.presence")

    async def answer(msg: Msg) -> None:
        await msg.respond(b"listed:" + msg.data)

    await w2.nc.subscribe("smith.ps.W2", cb=answer)
    await w2.nc.flush()
    reply = await _request_once_heard(w1.nc, "smith.ps.W2", b'{"op":"list"}\n')
    assert reply.data == b'listed:{"op":"list"}\n' and reply.subject.startswith("_INBOX.W1.")
    await w2.nc.publish("smith.presence", b'{"worker":"W2"}')
    assert (await asyncio.wait_for(w1_presence.get(), 5)).data == b'{"worker":"W2"}'
    await w1.nc.subscribe("smith.ps.W2")
    await w1.refused("subscription", "smith.ps.W2")
    await w1.nc.subscribe("_INBOX.W2.>")
    await w1.refused("subscription", "_INBOX.W2.>")
    assert w2.refusals == [] and w1.nc.is_connected


async def test_a_gateway_cannot_read_or_send_as_another_gateway(connect: Connect) -> None:
    g1, g2, worker = await connect("gateway", "G1"), await connect("gateway", "G2"), await connect("worker", "W1")
    sessions = await _receiver(worker, "smith.s.W1.>")
    await g2.nc.subscribe("smith.g.G1.>")
    await g2.refused("subscription", "smith.g.G1.>")
    await g2.nc.subscribe("_INBOX.G1.>")
    await g2.refused("subscription", "_INBOX.G1.>")
    await g2.nc.publish("smith.s.W1.G1.x", b"forged")
    await g2.refused("publish", "smith.s.W1.G1.x")
    await g2.nc.publish("smith.hb.G1", b"")
    await g2.refused("publish", "smith.hb.G1")
    # a gateway is no worker either: it cannot announce one nor answer as one
    await g2.nc.publish("smith.presence", b'{"worker":"W9"}')
    await g2.refused("publish", "smith.presence")
    await g2.nc.publish("smith.g.G1.W1.C1", b"forged")
    await g2.refused("publish", "smith.g.G1.W1.C1")
    # what G1 itself sends arrives: the refusals above are about G2, not the subjects
    await g1.nc.publish("smith.s.W1.G1.C1", b"real")
    assert (await asyncio.wait_for(sessions.get(), 5)).data == b"real"
    assert sessions.empty()


@pytest.mark.parametrize(("role", "ident"), [("gateway", "G1"), ("worker", "W1")])
async def test_nobody_reaches_jetstream_kv_or_the_system_account(connect: Connect, role: str, ident: str) -> None:
    peer = await connect(role, ident)
    for subject in ("$JS.API.INFO", "$JS.API.STREAM.CREATE.SMITH", "$KV.smith-hooks.x", "$SYS.REQ.SERVER.PING"):
        await peer.nc.publish(subject, b"{}")
        await peer.refused("publish", subject)
    for subject in ("$JS.>", "$KV.>", "$SYS.>", ">"):
        await peer.nc.subscribe(subject)
        await peer.refused("subscription", subject)
    with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
        await peer.nc.request("$JS.API.INFO", b"", timeout=1)
    assert peer.nc.is_connected


# ---- keeping the credentials out of commands -------------------------------------------------------


def test_smith_nats_names_are_refused_in_every_mode() -> None:
    names = ["SMITH_NATS_TOKEN", "SMITH_NATS_PASSWORD", "SMITH_NATS_USER", "SMITH_NATS_NKEY", "OK"]
    for policy in ("denylist", "allowlist"):
        assert refused_names(names, allow=set(names), policy=policy) == names[:4], policy


def test_a_command_can_neither_set_nor_see_the_nats_credentials(tmp_path: pathlib.Path) -> None:
    secret = "nats-secret-5f1e0c"
    srv = ServerProcess(tmp_path, "--allow-env", "SMITH_NATS_TOKEN", env={"SMITH_NATS_TOKEN": secret, "SMITH_NATS_PASSWORD": secret}).start()
    try:
        peer = V1Peer(srv.unix)
        peer.handshake()
        peer.command(shell_exec=pb.ShellExecCommand(request_id="see", command="env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"))
        envs = peer.until(terminal("see"))
        out = "".join(e.event.shell_output.stdout for e in envs)
        assert "SMITH_FAST=1" in out and "SMITH_NATS" not in out and secret not in out
        # --allow-env names it, and it is still refused: no request hands NATS credentials to a command
        peer.command(shell_exec=pb.ShellExecCommand(request_id="set", command="echo ran", env={"SMITH_NATS_TOKEN": "mine"}))
        envs = peer.until(terminal("set"))
        (err,) = errors(envs)
        assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and err.details["variables"] == "SMITH_NATS_TOKEN"
        assert "NATS fleet's credentials" in err.message and "--allow-env" not in err.message
        assert not any(e.event.shell_output.stdout for e in envs)
        peer.close()
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)
