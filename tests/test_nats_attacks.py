"""The NATS control plane against hostile parties: a command on a worker, a listener on NATS.

Real nats-server, gateway and workers. tests/test_nats_security.py checks the permissions of each
role on the NATS server itself; these check what a sandboxed command of a session can reach
(neither the worker's key, nor its NATS credentials in the environment, nor NATS without a
key; with ``--network loopback`` not even the server's port) and what travels over NATS (never
the frontend's token; a resume token only between the session's gateway and its worker).
"""

from __future__ import annotations

import asyncio
import json
import pathlib

import nats
import pytest

from harness.nats_cluster import Cluster
from smith_fast._varint import decode as decode_varint
from smith_fast.client import Client
from smith_fast.nats import relay

FAST = ("--presence-interval", "0.3")

# Connects to the NATS port anonymously and prints what the server answers to CONNECT + PING.
PROBE = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
s.recv(4096)  # INFO
s.sendall(b'CONNECT {"verbose":false,"pedantic":false}' + bytes([13, 10]) + b'PING' + bytes([13, 10]))
print(s.recv(4096).decode(errors="replace"))
"""


def _probe(cluster: Cluster) -> str:
    """The command that probes the NATS port, its script written where the worker's commands run."""
    (cluster.root / "probe.py").write_text(PROBE)
    return f"python3 probe.py {cluster.nats.port}"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    tmp = tmp_path_factory.mktemp("nats-attacks")
    # the keys inside the directory the worker serves: in its commands' view, were they not hidden
    c = Cluster(tmp, workers=1, nats_args=FAST, keys=tmp / "root" / "keys").start()
    yield c  # type: ignore[misc]
    c.stop()


async def test_a_command_reads_neither_the_workers_key_nor_its_credentials(guarded: Cluster) -> None:
    assert guarded.keys is not None
    key = guarded.keys / "worker-w0.nk"
    seed = key.read_text().strip()
    async with await Client.connect(guarded.unix) as client:
        await client.handshake(["shell_exec"])
        read = await client.run(f"cat {key}")
        assert seed.encode() not in read.stdout + read.stderr and read.exit_code != 0, read
        env = await client.run("env")
        assert b"SMITH_NATS" not in env.stdout and b"SUAF" not in env.stdout.upper()  # nkey seeds start SU...
        probe = await client.run(_probe(guarded))
        assert b"Authorization Violation" in probe.stdout, probe  # reaching the port gives nothing without a key


async def test_with_network_loopback_a_command_cannot_reach_nats_at_all(tmp_path: pathlib.Path) -> None:
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, worker_args=("--network", "loopback")).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            probe = await client.run(_probe(cluster))
            assert probe.exit_code != 0 and b"ConnectionRefused" in probe.stderr, probe
    finally:
        cluster.stop()


async def test_the_frontend_token_never_travels_and_a_resume_token_only_between_gateway_and_worker(tmp_path: pathlib.Path) -> None:
    # No credentials on this server, so that a listener can see every subject: what would an
    # identity with read access to all of NATS learn?
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, auth=False)
    token = "frontend-secret-8c1f2e"
    cluster.gateway.env["SMITH_TOKEN"] = token
    cluster.start()
    seen: list[tuple[str, bytes]] = []
    nc = await nats.connect(cluster.nats.url)
    try:

        async def record(msg: nats.aio.msg.Msg) -> None:
            seen.append((msg.subject, msg.data))

        await nc.subscribe(">", cb=record)
        await nc.flush()
        async with await Client.connect(cluster.unix, token=token, resume=True) as client:
            ready = await client.handshake(["shell_exec"], accept=["resume"])
            resume_token = ready.resume_token
            assert resume_token.startswith("w0.")  # it leads a gateway to the worker holding the session
            assert (await client.run("echo hi")).stdout == b"hi\n"
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
        cluster.stop()
    assert seen, "the listener heard nothing"
    assert not [s for s, data in seen if token.encode() in data], "the frontend token travelled on NATS"
    carrying = {s.rsplit(".", 1)[0] for s, data in seen if resume_token.encode() in data}
    assert carrying == {"smith.g.g0.w0"}, carrying  # only the worker's answer to its gateway
    opened = [_opening(body) for s, data in seen if s.startswith("smith.s.w0.g0.")
              for _, kind, body in [relay.unpack(data)] if kind == relay.OPEN]
    assert opened and all("token" not in o for o in opened)


def _opening(body: memoryview) -> dict[str, object]:
    """The JSON of an OPEN's body (a varint size, then it; the frontend's first bytes follow)."""
    size, at = decode_varint(bytes(body[:10]))
    opening: dict[str, object] = json.loads(bytes(body[at : at + size]))
    return opening


async def test_a_worker_identity_cannot_open_sessions_on_another_worker(guarded: Cluster) -> None:
    """Only a gateway's identity may publish to a worker's open subject: a compromised worker
    cannot start sessions (and so commands) on another one."""
    assert guarded.keys is not None
    errors: list[str] = []

    async def note(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(guarded.nats.url, nkeys_seed=str(guarded.keys / "worker-w1.nk"), error_cb=note)
    try:
        request = json.dumps({"protocol": "v1", "peer": "x", "first_sequence": 1}).encode()
        opening = relay.pack(1, relay.OPEN, bytes([len(request)]) + request)
        await nc.publish("smith.s.w0.g0.intruder", opening)  # the server drops it: not a gateway's subject
        await nc.flush()
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    assert any("permissions violation" in e.lower() for e in errors), errors
    async with await Client.connect(guarded.unix) as client:  # the worker carries on
        await client.handshake(["shell_exec"])
        assert (await client.run("echo fine")).stdout == b"fine\n"
