"""A session lives on one worker: placement by labels and load, and consistency across calls.

Real nats-server (with nkeys and per-role permissions), real gateway and worker processes, driven
by the SDK; plus unit tests of :class:`~smith_fast.nats.placement.Placement` on announcements.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import random
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator

import pytest

from harness.nats_cluster import Cluster, wait_gateway
from smith_fast.client import Client, SmithError
from smith_fast.nats.placement import Placement, parse_labels
from smith_fast.nats.presence import Announcement
from smith_fast.pb import smith_pb2 as pb

FAST = ("--presence-interval", "0.3")

# ---- placement, on announcements --------------------------------------------------------------------


def _ann(worker: str, **kw: object) -> Announcement:
    base: dict[str, object] = {"version": "0.1.0", "capacity": 64, "max_sessions": 10}
    base.update(kw)
    return Announcement(worker=worker, **base)  # type: ignore[arg-type]


def test_labels_parse_and_refuse_what_is_no_pair() -> None:
    assert parse_labels("zone=b, gpu=1,,") == {"zone": "b", "gpu": "1"}
    assert parse_labels("") == {}
    for bad in ["zone", "=b", "a=1,b"]:
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_labels(bad)


def test_placement_fits_labels_slots_versions_and_draining() -> None:
    placement = Placement(random.Random(1))
    workers = [
        _ann("a", labels={"zone": "a"}),
        _ann("b", labels={"zone": "b"}, sessions=10),  # full
        _ann("c", labels={"zone": "b"}),
        _ann("d", labels={"zone": "b"}, draining=True),
        _ann("e", labels={"zone": "b"}, version="9.0.0"),  # another major version: another protocol
    ]
    assert placement.choose(workers, {"zone": "b"}) == "c"
    assert placement.choose(workers, {"zone": "x"}) is None
    assert placement.choose(workers, {"zone": "b"}, exclude={"c"}) is None


def test_placement_prefers_the_emptier_and_counts_what_it_placed() -> None:
    placement = Placement(random.Random(7))
    workers = [_ann("a", sessions=8), _ann("b", sessions=0), _ann("c", running=60, capacity=64)]
    assert placement.choose(workers, {}) == "b"
    # sessions placed since the last announcements count: 10 new sessions spread, not all on b
    got = collections.Counter(placement.choose(workers, {}) for _ in range(9))
    assert got["b"] < 9 and got["a"] >= 1, got
    placement.heard("b")  # b announced: what was placed there is in its figures now
    assert placement.load(workers[1]) == 0.0


# ---- end to end ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three workers serving different directories (as on three machines), labelled by zone."""
    tmp = tmp_path_factory.mktemp("nats-sessions")
    c = Cluster(tmp, workers=3, nats_args=FAST, roots=True, labels={0: ("zone=a",), 1: ("zone=b",), 2: ("zone=c",)},
                gateway_args=("--queue-timeout", "1", "--queue-notice", "0.3", "--metrics", "127.0.0.1:0")).start()
    yield c
    codes = c.stop()
    assert set(codes.values()) == {0}, codes


async def test_write_then_read_then_exec_is_consistent_100_of_100(spread: Cluster) -> None:
    async with await Client.connect(spread.unix) as client:
        ready = await client.handshake(["shell_exec"])
        worker = ready.service_info["smith_fast.worker"]
        consistent = 0
        for i in range(100):
            text = f"round {i}"
            written = await client.call_tool("fs.write", {"path": "f.txt", "content": text})
            assert written.success
            cat = await client.run("cat f.txt")
            pid = await client.run("sh -c 'echo $$ > pid; cat pid'")
            consistent += cat.stdout == text.encode() and pid.exit_code == 0 and pid.stdout.strip().isdigit()
        assert consistent == 100
        # everything landed in its worker's directory, none in the others'
        n = int(worker.removeprefix("w"))
        assert (spread.worker_root(n) / "f.txt").read_text() == "round 99"
        assert [m for m in range(3) if m != n and (spread.worker_root(m) / "f.txt").exists()] == []


async def test_a_handshake_asking_for_a_label_lands_on_a_worker_that_has_it(spread: Cluster) -> None:
    for zone, worker in [("b", "w1"), ("c", "w2"), ("a", "w0")]:
        async with await Client.connect(spread.unix) as client:
            ready = await client.handshake(["shell_exec"], client_info={"smith_fast.placement": f"zone={zone}"})
            assert ready.service_info["smith_fast.worker"] == worker
            assert ready.service_info["smith_fast.labels"] == f"zone={zone}"


async def test_no_worker_with_the_label_a_notice_then_no_worker_and_the_connection_stays(spread: Cluster) -> None:
    async with await Client.connect(spread.unix) as client:
        with pytest.raises(SmithError) as info:
            await client.handshake(["shell_exec"], client_info={"smith_fast.placement": "zone=mars"})
        assert info.value.code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and info.value.details["reason"] == "no_worker"
        notices = client.notices
        assert [n.fields["reason"] for n in notices] == ["placing"] and notices[0].level == pb.LOG_LEVEL_WARN
        # the same connection: a handshake that fits is placed
        ready = await client.handshake(["shell_exec"], client_info={"smith_fast.placement": "zone=a"})
        assert ready.service_info["smith_fast.worker"] == "w0"
        assert (await client.run("echo hi")).stdout == b"hi\n"


async def test_sessions_spread_over_the_workers_and_the_gateway_counts_them(spread: Cluster) -> None:
    clients = [await Client.connect(spread.unix) for _ in range(12)]
    try:
        placed = collections.Counter()
        for client in clients:
            ready = await client.handshake(["shell_exec"])
            placed[ready.service_info["smith_fast.worker"]] += 1
        assert set(placed) == {"w0", "w1", "w2"} and max(placed.values()) - min(placed.values()) <= 3, placed
        url = spread.gateway.metrics_url
        assert url is not None
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        relayed = {line.split('"')[1]: float(line.split()[-1]) for line in body.splitlines()
                   if line.startswith("smith_fast_nats_sessions{")}
        assert all(relayed[w] >= placed[w] for w in placed), (relayed, placed)
    finally:
        for client in clients:
            await client.close()


async def test_a_worker_runs_only_what_it_was_opened_for(spread: Cluster, tmp_path: pathlib.Path) -> None:
    """A relay message for a connection no gateway opened is dropped: nothing runs, the worker carries on."""
    import nats

    assert spread.keys is not None
    nc = await nats.connect(spread.nats.url, nkeys_seed=str(spread.keys / "gateway-g1.nk"), inbox_prefix="_INBOX.g1")
    try:
        marker = spread.worker_root(0) / "never"
        env = pb.Envelope()
        env.command.shell_exec.request_id = "x"
        env.command.shell_exec.command = f"touch {marker}"
        body = env.SerializeToString()
        from smith_fast.framing import encode_varint
        from smith_fast.nats import relay

        await nc.publish("smith.s.w0.g1.nosuchconn", relay.pack(1, relay.DATA, encode_varint(len(body)) + body))
        await nc.flush()
        await asyncio.sleep(0.5)
        assert not marker.exists()
    finally:
        await nc.close()
    async with await Client.connect(spread.unix) as client:
        await client.handshake(["shell_exec"], client_info={"smith_fast.placement": "zone=a"})
        assert (await client.run("echo still")).stdout == b"still\n"


@pytest.mark.parametrize("acks", [True, False])
async def test_a_worker_acknowledges_what_it_reads_only_for_a_gateway_that_asked(spread: Cluster, acks: bool) -> None:
    """Gathering (relay.py) is agreed in the OPEN and its OPENED: a gateway that asks (``"acks":
    true``) gets an ACK for every DATA the worker reads; an older one, which does not ask, never
    gets the kind it would not know."""
    import json

    import nats

    from smith_fast.framing import encode_frame, encode_varint
    from smith_fast.nats import relay

    assert spread.keys is not None
    nc = await nats.connect(spread.nats.url, nkeys_seed=str(spread.keys / "gateway-g1.nk"), inbox_prefix="_INBOX.g1")
    conn = f"agreed{int(acks)}"
    got: list[tuple[int, int, bytes]] = []

    async def heard(msg: nats.aio.msg.Msg) -> None:
        seq, kind, body = relay.unpack(msg.data)
        got.append((seq, kind, bytes(body)))

    def frame(command: pb.Command) -> bytes:
        return encode_frame(pb.Envelope(command=command).SerializeToString())

    try:
        await nc.subscribe(f"smith.g.g1.w0.{conn}", cb=heard)
        opening = {"protocol": "v1", "peer": "compat", "first_sequence": 1} | ({"acks": True} if acks else {})
        head = json.dumps(opening).encode()
        handshake = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
        await nc.publish(f"smith.s.w0.g1.{conn}", relay.pack(1, relay.OPEN, encode_varint(len(head)) + head + frame(handshake)))
        # three DATA the session answers only once its commands ended (half a second): the ACK first
        for seq in (2, 3, 4):
            sleep = pb.Command(shell_exec=pb.ShellExecCommand(request_id=f"r{seq}", command="sleep 0.5"))
            await nc.publish(f"smith.s.w0.g1.{conn}", relay.pack(seq, relay.DATA, frame(sleep)))
        await nc.flush()
        deadline = asyncio.get_running_loop().time() + 20

        def told(rid: bytes) -> int:  # the DATA that carry its events: its start, then its end
            return sum(rid in body for _, kind, body in got if kind == relay.DATA)

        while asyncio.get_running_loop().time() < deadline and min(told(b"r2"), told(b"r3"), told(b"r4")) < 2:
            await asyncio.sleep(0.05)
        await nc.publish(f"smith.s.w0.g1.{conn}", relay.pack(5, relay.CLOSE, b"peer_gone"))
        await nc.flush()
    finally:
        await nc.close()
    assert [seq for seq, _, _ in got] == list(range(1, len(got) + 1))  # in order, none lost
    assert got[0][1] == relay.OPENED and (json.loads(got[0][2]).get("acks") is True) == acks
    counts = [relay_count for _, kind, body in got if kind == relay.ACK for relay_count in [body[0]]]
    if acks:
        assert sum(counts) == 3, got  # each DATA once (some together)
    else:
        assert counts == [], got


async def test_a_full_worker_refuses_another_gateways_session_which_ends_no_worker() -> None:
    """Two gateways, one worker with room for one session. The second gateway has not heard that the
    first placed a session there (announcements every 30 s): it offers the worker a session, the
    worker refuses it (``max_sessions``), and that session ends ``no_worker`` after --queue-timeout;
    the first session goes on. The first offer is made as the handshake is read and its refusal
    read without a task of its own, so this is the path that starts placing again."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-natsfull-", dir="/var/tmp"))  # its command runs sandboxed
    c = Cluster(tmp, workers=0, nats_args=("--presence-interval", "30"), gateway_args=("--queue-timeout", "1", "--queue-notice", "0.3"))
    try:
        c.nats.start()
        c.make_worker("--max-sessions", "1").start()
        c.gateway.start()
        c.wait_connected(1)
        second = c.make_gateway().start()
        wait_gateway(second, 1, 20)
        async with await Client.connect(c.unix) as first:
            ready = await first.handshake(["shell_exec"])
            assert ready.service_info["smith_fast.worker"] == "w0"
            async with await Client.connect(second.unix) as refused:
                with pytest.raises(SmithError) as info:
                    await refused.handshake(["shell_exec"])
                assert info.value.code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and info.value.details["reason"] == "no_worker"
                assert [n.fields["reason"] for n in refused.notices] == ["placing"]
            said = [(r.get("worker"), r.get("reason")) for r in second.logs if r.get("event") == "worker did not take the session"]
            assert said[:1] == [("w0", "max_sessions")], second.raw_stderr[-20:]
            assert (await first.run("echo still here")).stdout == b"still here\n"
    finally:
        codes = c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert set(codes.values()) == {0}, codes
