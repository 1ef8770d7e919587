"""Background processes through the NATS gateway (PROTOCOL.md, "Scale-out over NATS", "Background
processes"): a background
ShellExec runs on a worker and stays there; ListProcesses asks every live worker; Attach, Cancel,
Stdin and Resize of a background id go to the worker holding it; a process whose worker is gone
gets ``worker_gone``.

Real parts only: nats-server on a loopback port, ``smith-fast gateway`` and ``worker`` processes
(``harness/nats_cluster.py``), the SDK and raw commands over the gateway's Unix socket. Processes
are looked for among the workers' descendants in /proc. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import signal
from collections.abc import Iterator

import pytest

from harness.cutting_proxy import CuttingProxy
from harness.nats_cluster import Cluster, logged
from harness.server import SmithProcess, pid_alive, wait_until
from smith_fast.client import Client, SmithError
from smith_fast.nats.config import NatsConfig
from smith_fast.nats.presence import Announcement, LiveSet
from smith_fast.nats.processes import ProcessDirectory, worker_subject
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import terminal_state

from .test_background import attach_raw, background_exec
from .test_nats_control import FAST, LIMITS, _cmdlines, cluster, rid  # noqa: F401  (cluster: the fixture, a cluster of this module's own)
from .test_process_control import Raw, cancel, stdin
from .test_resume import ResumingPeer, cut_often


# ---- serve's background tests, run against a gateway and two workers ------------------------------------
# (collected here as this module's own tests: the `server` fixture below is what they are given)

from .test_background import (  # noqa: E402,F401
    test_a_terminal_resized_from_another_session,
    test_cli_exec_d_ps_attach_kill,
    test_detach_leaves_it_running_and_cancel_from_another_session_kills_the_tree,
    test_grpc_starts_one_a_socket_session_follows_it,
    test_outlives_its_session_then_another_session_attaches_from_0_and_follows,
    test_ring_drops_the_oldest_and_attach_says_where_it_starts,
    test_stdin_from_another_session_and_sdk_start_background,
    test_unknown_ids_and_grants,
    test_v0_starts_lists_and_attaches,
)


class _Gateway:
    """What those tests use of a service: its addresses and the workspace its commands run in."""

    def __init__(self, cluster: Cluster) -> None:
        self.unix, self.grpc, self.root = cluster.unix, cluster.grpc, cluster.root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Gateway]:
    c = Cluster(tmp_path_factory.mktemp("natsbg-serve"), workers=2, nats_args=FAST,
                worker_args=(*LIMITS, "--max-background", "16", "--background-buffer", "4k"), gateway_args=LIMITS).start()
    try:
        yield _Gateway(c)
    finally:
        c.stop()


def holders(cluster: Cluster, needle: str) -> list[SmithProcess]:
    """The workers with a descendant whose command line holds ``needle``."""
    return [w for w in cluster.workers if w.proc is not None and w.proc.poll() is None and any(needle in line for line in _cmdlines(w).values())]


async def connect(cluster: Cluster) -> Client:
    client = await Client.connect(cluster.unix)
    await client.handshake(["shell_exec"])
    return client


async def start_background(client: Client, command: str, pid_id: str, **fields: object) -> Raw:
    start = Raw(client, pid_id)
    client.send(background_exec(command, pid_id, **fields))
    assert terminal_state(await start.end()) == pb.SERVICE_STATE_READY, start.events
    notice = start.of("log")
    assert notice and notice[0].log.fields["reason"] == "background" and notice[0].log.fields["process_id"] == pid_id, start.events
    return start


async def test_started_closed_listed_attached_written_cancelled_by_a_new_session(cluster: Cluster) -> None:
    pid_id = rid()
    needle = f"bg-{pid_id[:8]}"
    first = await connect(cluster)
    await start_background(first, f"sh -c 'echo start; cat; echo end' {needle}", pid_id, open_stdin=True)
    await first.close()  # its session ends: the process stays on its worker
    assert wait_until(lambda: len(holders(cluster, needle)) == 1, 20), "the process is not on exactly one worker"

    second = await connect(cluster)
    listed = {p.id: p for p in await second.list_processes()}
    assert pid_id in listed, listed
    assert listed[pid_id].state == "running" and listed[pid_id].stdin_open and pid_alive(listed[pid_id].pid)
    shell_pid = listed[pid_id].pid

    raw = await attach_raw(second, pid_id, 0)
    early = await raw.until(lambda e: b"start\n" in raw.stdout())
    assert early.shell_output.offset == 0  # retained output from offset 0
    second.send(stdin(pid_id, b"hello through nats\n"))
    await raw.until(lambda e: b"hello through nats\n" in raw.stdout())
    assert raw.stdout() == b"start\nhello through nats\n"
    assert not raw.errors(), raw.errors()

    second.send(cancel(pid_id))
    final = await raw.until(lambda e: e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished)
    assert final.shell_output.exit_code in (-15, -9), final
    assert terminal_state(await raw.end()) == pb.SERVICE_STATE_READY
    await raw.quiet()
    assert raw.terminals() == [pb.SERVICE_STATE_READY]
    assert wait_until(lambda: not pid_alive(shell_pid), 10), "the background process survived its cancel"
    assert next(p for p in await second.list_processes() if p.id == pid_id).state == "exited"
    await second.close()


async def test_list_shows_the_processes_of_every_worker(cluster: Cluster) -> None:
    client = await connect(cluster)
    started: dict[str, str] = {}  # process id -> its needle
    try:
        for _ in range(12):  # until both workers hold one (which worker takes a command is JetStream's choice)
            pid_id = rid()
            needle = f"sleep 300.{int(pid_id[:6], 16)}"
            await start_background(client, needle, pid_id)
            started[pid_id] = needle
            assert wait_until(lambda: holders(cluster, needle), 20), "the sleep is not running on a worker"
            if len({id(w) for n in started.values() for w in holders(cluster, n)}) == 2:
                break
        on = {id(w) for n in started.values() for w in holders(cluster, n)}
        assert len(on) == 2, "the background processes all went to one worker"
        listed = {p.id: p for p in await client.list_processes()}
        assert set(started) <= set(listed), (set(started) - set(listed))
        assert all(listed[p].state == "running" for p in started)
        shells = [p.pid for p in await client.list_processes() if p.id in started]
        assert sorted(shells) == sorted({listed[p].pid for p in started})
    finally:
        for pid_id in started:
            client.cancel(pid_id)
        assert wait_until(lambda: not any(holders(cluster, n) for n in started.values()), 20)
        await client.close()


async def test_unknown_ids_and_grants_through_the_gateway(cluster: Cluster) -> None:
    client = await connect(cluster)
    missing = rid()
    with pytest.raises(SmithError, match=f"no background process {missing}") as info:
        await (await client.attach(missing)).wait()
    assert info.value.error.details["reason"] == "unknown_process"
    pid_id = rid()
    start = await start_background(client, "sleep 30", pid_id)
    bare = await Client.connect(cluster.unix)
    await bare.handshake([])  # no shell_exec: it can neither list nor steer
    with pytest.raises(SmithError, match="shell_exec"):
        await bare.list_processes()
    raw = Raw(bare, pid_id)
    bare.cancel(pid_id)
    refused = await raw.until(lambda e: e.WhichOneof("event_type") == "error")
    assert refused.error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY and refused.error.request_id == pid_id
    assert next(p for p in await client.list_processes() if p.id == pid_id).state == "running"
    client.send(background_exec("sleep 1", pid_id))  # the same id again, whichever worker would take it
    assert terminal_state(await start.end()) == pb.SERVICE_STATE_ERROR
    assert [e.details["reason"] for e in start.errors()] == ["duplicate_id"], start.errors()
    client.cancel(pid_id)
    assert await (await client.attach(pid_id, 1 << 40)).wait() < 0
    await bare.close()
    await client.close()


async def test_a_gateway_restart_leaves_them_running_and_a_new_session_finds_them(cluster: Cluster) -> None:
    pid_id = rid()
    needle = f"bg-{pid_id[:8]}"
    client = await connect(cluster)
    await start_background(client, f"sh -c 'echo before; cat; echo after' {needle}", pid_id, open_stdin=True)
    await client.close()
    cluster.gateway.stop()
    assert holders(cluster, needle), "the process died with the gateway"
    joined = logged(cluster.gateway, "worker joined")  # (its log goes on across the restart)
    cluster.gateway.start()
    assert wait_until(lambda: logged(cluster.gateway, "worker joined") >= joined + len(cluster.workers), 20)
    client = await connect(cluster)
    assert pid_id in {p.id for p in await client.list_processes()}
    follower = await client.attach(pid_id)
    client.send(stdin(pid_id, b"again\n", eof=True))
    assert await follower.wait() == 0
    assert follower.output().stdout == b"before\nagain\nafter\n"
    await client.close()


async def test_a_killed_workers_processes_are_gone_and_naming_one_says_so(tmp_path: pathlib.Path) -> None:
    cluster = Cluster(tmp_path, workers=2, nats_args=FAST, worker_args=LIMITS, gateway_args=LIMITS).start()
    try:
        client = await connect(cluster)
        started: dict[str, str] = {}
        raws: dict[str, Raw] = {}  # the start's: later events naming the process id arrive there
        for _ in range(12):
            pid_id = rid()
            needle = f"sleep 300.{int(pid_id[:6], 16)}"
            raws[pid_id] = await start_background(client, needle, pid_id)
            started[pid_id] = needle
            assert wait_until(lambda: holders(cluster, needle), 20)
            if len({id(w) for n in started.values() for w in holders(cluster, n)}) == 2:
                break
        victim_id, victim_needle = next(iter(started.items()))
        victim = holders(cluster, victim_needle)[0]
        kept = {p for p, n in started.items() if holders(cluster, n)[0] is not victim}
        assert kept, "the background processes all went to one worker"
        gone = {p for p in started if p not in kept}
        shells = [p.pid for p in await client.list_processes() if p.id in gone]
        assert len(shells) == len(gone) and all(pid_alive(pid) for pid in shells)
        following = await attach_raw(client, victim_id, 1 << 40)  # an attach running when its worker dies
        await following.until(lambda e: e.WhichOneof("event_type") == "state_change")  # PROCESSING: it runs on the worker
        assert victim.proc is not None
        # The starts acknowledged first: a worker acks its command messages a moment after they
        # end (acks leave together), and one killed before that has its start redelivered to the
        # other worker after the ack wait (at least once: the process would then be started anew
        # there). That is the queue's rule, not what this test is about.
        await _acknowledged(cluster)
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        assert wait_until(lambda: not any(pid_alive(pid) for pid in shells), 20), "a background process outlived its worker (child guard)"

        ended = await following.end()  # once the gateway takes the worker as gone (3 silent presence intervals)
        assert terminal_state(ended) == pb.SERVICE_STATE_ERROR
        assert [e.details["reason"] for e in following.errors()] == ["worker_gone"], following.errors()

        for _ in range(2):  # at once (no responder on its subject), and once the gateway took it as gone
            listed = {p.id for p in await client.list_processes()}
            assert not (gone & listed), listed
            assert kept <= listed, (kept - listed)
            with pytest.raises(SmithError) as info:
                await (await client.attach(victim_id)).wait()
            assert info.value.error.details["reason"] == "worker_gone", info.value.error
            assert victim_id in info.value.error.message and "gone" in info.value.error.message
            raw = raws[victim_id]
            client.cancel(victim_id)
            refused = await raw.until(lambda e: e.WhichOneof("event_type") == "error")
            assert refused.error.details["reason"] == "worker_gone" and raw.terminals() == [pb.SERVICE_STATE_READY]  # the start's only
            await asyncio.sleep(1.5)  # the gateway's presence set drops the silent worker (3 x 0.3 s)
        for pid_id in kept:
            client.cancel(pid_id)
        await client.close()
    finally:
        cluster.stop()


async def _acknowledged(cluster: Cluster) -> None:
    """Until the workers' command consumer has nothing delivered and unacknowledged."""
    import nats

    nc = await nats.connect(cluster.nats.url)
    try:
        js = nc.jetstream()
        for _ in range(100):
            info = await js.consumer_info("SMITH_CMD", "smith-workers")
            if info.num_ack_pending == 0 and info.num_pending == 0:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"command messages still unacknowledged: {info}")
    finally:
        await nc.close()


def test_an_announcement_lists_the_workers_background_processes() -> None:
    ann = Announcement("host:1", "1.0", 4, background=("r1", "r2"))
    assert Announcement.decode(ann.encode()) == ann
    assert Announcement.decode(b'{"worker": "w", "version": "1", "capacity": 1}').background == ()  # an older worker's
    for bad in (b'{"worker": "w", "version": "1", "capacity": 1, "background": "r1"}',
                b'{"worker": "w", "version": "1", "capacity": 1, "background": [1]}'):
        with pytest.raises(ValueError, match="background"):
            Announcement.decode(bad)


async def test_a_stopped_worker_ends_its_processes_and_their_attaches(tmp_path: pathlib.Path) -> None:
    """SIGTERM: the worker terminates its background processes first (as serve does on shutdown),
    so an attach following one gets its exit; then it leaves and its processes are not listed."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, worker_args=LIMITS, gateway_args=LIMITS).start()
    try:
        client = await connect(cluster)
        pid_id = rid()
        await start_background(client, "sleep 300", pid_id)
        shell = next(p.pid for p in await client.list_processes() if p.id == pid_id)
        following = await attach_raw(client, pid_id, 1 << 40)
        await following.until(lambda e: e.WhichOneof("event_type") == "state_change")  # PROCESSING: it runs on the worker
        worker = cluster.workers[0]
        assert worker.stop() == 0
        assert terminal_state(await following.end()) in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
        finals = [e.shell_output for e in following.of("shell_output") if e.shell_output.finished]
        reasons = [e.details["reason"] for e in following.errors()]
        assert (len(finals) == 1 and finals[0].exit_code in (-15, -9)) or reasons == ["worker_gone"], following.events
        print("attach ended by", "its exit" if finals else "worker_gone")
        assert not pid_alive(shell)
        assert pid_id not in {p.id for p in await client.list_processes()}
        await client.close()
    finally:
        cluster.stop()


# ---- resume through the gateway: a frontend's connection cut, the workers streaming on ----------------

RESUME_CUTS = 20


async def test_resume_through_the_gateway_after_20_cuts_loses_and_duplicates_nothing(tmp_path: pathlib.Path) -> None:
    """The frontend's connection to a gateway is a session like serve's: cut it again and again
    while commands stream output from a worker; the peer resumes each time with its token and last
    sequence, and every event arrives once, in order."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, worker_args=LIMITS, gateway_args=LIMITS).start()
    try:
        async with CuttingProxy(cluster.tcp) as proxy:
            peer = ResumingPeer(proxy.address, **{"smith_fast.accept": "resume"})
            await peer.start()
            # cuts spread over several requests, each streaming from the worker through the gateway
            await cut_often(proxy, peer, cuts=RESUME_CUTS, rng=random.Random(19), burst=5000, paced=200, pause=(0.02, 0.12), in_flight=2,
                            timeout=180)
            cuts = proxy.cuts
        print(f"{peer.resumes} resumes, {len(peer.requests)} requests, {peer.duplicates} duplicates refused, {peer.replayed} replayed")
        assert peer.unexpected == []
        assert peer.resumes >= RESUME_CUTS and cuts >= RESUME_CUTS
        assert len(peer.requests) >= 2
        for request_id, req in peer.requests.items():
            assert req.terminal == [pb.SERVICE_STATE_READY], request_id
            assert req.processing == 1 and req.finished == 1 and req.exit_code == 0, request_id
            assert "".join(req.stdout) == req.expected, request_id
    finally:
        cluster.stop()


def test_the_gateways_directory_follows_the_workers_announcements() -> None:
    now = [0.0]
    live = LiveSet(1.0, clock=lambda: now[0])
    directory = ProcessDirectory(NatsConfig(), live)
    gone: list[str] = []
    for ann in (Announcement("a:1", "1", 4, background=("p1", "p2")), Announcement("b:2", "1", 4, background=("p3",))):
        live.heard(ann)
        directory.heard(ann)
    assert [directory.held(p) for p in ("p1", "p2", "p3", "p4")] == ["a:1", "a:1", "b:2", None]
    directory.expect("p4")  # seen started through this gateway, not announced yet: looked for
    assert directory.knows("p4") and directory.held("p4") is None
    directory.watch("a:1", lambda: gone.append("a:1"))
    exited = Announcement("a:1", "1", 4, background=("p2",))  # p1 made room for a newer one
    live.heard(exited)
    directory.heard(exited)
    assert directory.held("p1") is None and not directory.knows("p1") and directory.held("p2") == "a:1"
    now[0] = 10.0  # a:1 and b:2 fell silent
    live.heard(Announcement("b:2", "1", 4, background=("p3",)))
    directory.prune(a.worker for a in live.alive())
    assert gone == ["a:1"] and directory.held("p2") is None and directory.knows("p2")  # worker_gone from now on
    assert directory.held("p3") == "b:2"
    assert worker_subject(NatsConfig(), "host.example:42") == "smith.wrk.host_example_42"
