"""A gateway gone for good does not leave its requests running on the workers (smith_fast/nats/leases.py).

Gateways announce themselves on ``<prefix>.gateway.<id>`` every ``--presence-interval``; a worker
ends the sessions of a gateway silent for longer than its ``--gateway-lease`` as a
``Smith-Control: end`` would. The bookkeeping (:class:`Leases`) is checked with a clock of the
test's own; the rest with real parts: nats-server on a loopback port, ``smith-fast gateway`` and
``worker`` processes (``harness/nats_cluster.py``), a gateway SIGKILLed for real, the command's
process looked for in /proc. No timing is asserted (the deadlines only bound a failing wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.nats_cluster import Cluster
from harness.server import SmithProcess, host_pids, pid_alive, wait_until
from smith_fast.client import Client, event_request_id
from smith_fast.nats.config import NatsConfig
from smith_fast.nats.batching import split_events
from smith_fast.nats.leases import Lapse, Leases, heartbeat_subject
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import terminal_state

from .test_process_control import Raw, shell, started

GONE = "gateway gone: ending its sessions"
FAST = ("--presence-interval", "0.2", "--ack-wait", "5", "--duplicate-window", "60")


# ---- the bookkeeping, on a clock of the test's own ---------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _leases(lease: float = 10.0, prefix: str = "smith") -> tuple[Leases, Clock]:
    clock = Clock()
    return Leases(NatsConfig(prefix=prefix, gateway_lease=lease), clock=clock), clock


def test_heartbeat_subject() -> None:
    assert heartbeat_subject(NatsConfig(prefix="a.b"), "gw-1") == "a.b.gateway.gw-1"
    assert heartbeat_subject(NatsConfig(), "*") == "smith.gateway.*"
    assert NatsConfig().gateway_lease == 120.0


def test_a_heard_gateway_keeps_its_sessions_and_a_silent_one_loses_them() -> None:
    leases, clock = _leases(10)
    leases.heard("gw")
    leases.serving("smith.evt.gw.s1", "s1")
    leases.serving("smith.evt.gw.s2", "s2")
    for _ in range(5):  # heard every 5 s: never silent for the lease
        clock.now += 5
        leases.heard("gw")
        assert leases.expired() == []
    clock.now += 10
    assert leases.expired() == []  # exactly the lease: not yet
    clock.now += 0.5
    assert leases.expired() == [Lapse("gw", ("s1", "s2"), 10.5, True)]
    assert len(leases) == 0 and leases.expired() == []  # ended once


def test_silence_counts_from_the_first_command_of_a_session() -> None:
    """A worker that first hears of a session after its gateway died gives it the whole lease."""
    leases, clock = _leases(10)
    leases.heard("gw")
    clock.now += 100  # the gateway died long ago
    leases.serving("smith.evt.gw.late", "late")
    clock.now += 9
    leases.serving("smith.evt.gw.later", "later")
    assert leases.expired() == []
    clock.now += 2  # "late" waited 11 s, "later" 2 s
    assert leases.expired() == [Lapse("gw", ("late",), 11, True)]
    clock.now += 8
    assert leases.expired() == []  # exactly the lease
    clock.now += 0.5
    assert leases.expired() == [Lapse("gw", ("later",), 10.5, True)]
    never, clock = _leases(10)  # a gateway this worker never heard
    never.serving("smith.evt.other.s", "s")
    clock.now += 10.5
    assert never.expired() == [Lapse("other", ("s",), 10.5, False)]


def test_a_worker_that_cannot_hear_counts_no_silence() -> None:
    leases, clock = _leases(10)
    leases.serving("smith.evt.gw.s", "s")
    leases.disconnected()
    clock.now += 60
    assert leases.expired() == []  # its own connection is down: nobody is silent
    leases.reconnected()
    clock.now += 9
    assert leases.expired() == []  # a whole lease from the reconnect
    clock.now += 2
    assert [lapse.sessions for lapse in leases.expired()] == [("s",)]


def test_forget_other_subjects_other_gateways_and_lease_zero() -> None:
    leases, clock = _leases(10, prefix="a.b")
    leases.serving("a.b.evt.gw.s1", "s1")
    leases.serving("a.b.evt.gw.s2", "s2")
    leases.forget("s1")  # ended by its gateway's `end`
    leases.serving("smith.evt.gw.s3", "s3")  # not this prefix
    leases.serving("a.b.evt.gw.other", "s4")  # not its session's subject
    leases.serving("a.b.evt.gw", "s5")  # no session token
    leases.serving("a.b.evt.gw2.s2", "s2")  # its commands now come from another gateway
    clock.now += 11
    leases.heard("gw2")
    assert leases.expired() == [] and len(leases) == 1  # gw has none left, gw2 was just heard
    leases.forget("s2")
    assert len(leases) == 0
    off, clock = _leases(0)
    off.serving("smith.evt.gw.s", "s")
    clock.now += 1e6
    assert off.expired() == [] and off.period > 0


# ---- real processes ---------------------------------------------------------------------------------------


def _cluster(tmp: pathlib.Path, lease: str, gateway_id: str, workers: int = 1) -> Cluster:
    return Cluster(tmp, workers=workers, nats_args=FAST, worker_args=("--gateway-lease", lease, "--kill-grace", "1s"),
                   gateway_args=("--gateway-id", gateway_id))


def _kill(proc: SmithProcess) -> None:
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()


def _gone_lines(worker: SmithProcess) -> list[dict[str, Any]]:
    return [r for r in list(worker.logs) if r.get("event") == GONE]


async def _stored_events(url: str, subject: str, rid: str) -> list[pb.Event]:
    """The events on ``subject`` in the event stream, read again from the start until one ends
    request ``rid`` (what a gateway restarted with its id would be handed)."""
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for _ in range(100):
            events: list[pb.Event] = []
            sub = await js.subscribe(subject, ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL))
            with contextlib.suppress(nats.errors.TimeoutError):
                while True:
                    msg = await sub.next_msg(timeout=0.5)
                    for _n, _attempt, _index, part, _shared in split_events(msg.headers or {}, msg.data, max(len(msg.data), 1)):
                        env = pb.Envelope.FromString(part)
                        events.extend(env.batch_event.events if env.HasField("batch_event") else [env.event])
            await sub.unsubscribe()
            if any(terminal_state(e) is not None and event_request_id(e) == rid for e in events):
                return events
            await asyncio.sleep(0.2)
        raise AssertionError(f"no final event of {rid} in the event stream")
    finally:
        await nc.close()


@pytest.fixture
def leased(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    c = _cluster(tmp_path, "2", "gw-lease").start()
    try:
        yield c
    finally:
        c.stop()


async def test_a_killed_gateways_command_is_ended_by_the_worker(leased: Cluster) -> None:
    cluster = leased
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = str(uuid.uuid4())
        raw = Raw(client, r)
        client.send(shell(r, "echo pid=$$; exec sleep 1000"))
        await started(raw, b"\n")
        # printed in its pid namespace
        (pid,) = host_pids(None, [int(raw.stdout().decode().strip().removeprefix("pid="))], "echo pid=$$; exec sleep 1000")
        assert pid_alive(pid)
        _kill(cluster.gateway)  # it never comes back, and tells nobody
    assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 30), "the dead gateway's command outlived its lease"
    # its end is reported as a shutdown's: there for the gateway, should it come back after all
    events = await _stored_events(cluster.nats.url, "smith.evt.gw-lease.>", r)
    mine = [e for e in events if event_request_id(e) == r]
    assert [terminal_state(e) for e in mine if terminal_state(e) is not None] == [pb.SERVICE_STATE_ERROR]
    assert [e.error.details["reason"] for e in mine if e.WhichOneof("event_type") == "error"] == ["cancelled"]
    assert [e.shell_output.exit_code for e in mine if e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished] == [-signal.SIGTERM]
    worker = cluster.workers[0]
    assert await asyncio.to_thread(wait_until, lambda: _gone_lines(worker), 10)
    [line] = _gone_lines(worker)
    assert line["level"] == "warning"
    assert line["gateway"] == "gw-lease" and len(line["sessions"]) == 1 and line["heard"] is True
    assert line["silent_seconds"] > line["gateway_lease"] == 2
    assert worker.proc is not None and worker.proc.poll() is None  # the worker goes on


async def test_a_live_gateways_long_command_is_not_ended(tmp_path: pathlib.Path) -> None:
    cluster = _cluster(tmp_path, "1", "gw-alive").start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            r = str(uuid.uuid4())
            raw = Raw(client, r)
            client.send(shell(r, "sleep 3; echo done"))  # three leases long
            await raw.until(lambda e: e.WhichOneof("event_type") == "state_change" and e.state_change.state in (
                pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR), timeout=60)
            assert raw.terminals() == [pb.SERVICE_STATE_READY]
            assert raw.stdout() == b"done\n"
            finished = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
            assert [f.exit_code for f in finished] == [0]
        assert _gone_lines(cluster.workers[0]) == []
    finally:
        codes = cluster.stop()
    assert set(codes.values()) == {0}, codes


async def test_a_worker_that_hears_of_a_session_after_its_gateway_died_gives_it_the_lease(tmp_path: pathlib.Path) -> None:
    """The gateway queues a command while no worker runs and is killed; the worker started after
    runs it (it was not dropped at once), then ends it when the lease counted from its arrival ran out."""
    cluster = _cluster(tmp_path, "2", "gw-early", workers=0).start()
    try:
        pidfile = cluster.root / f"pid-{uuid.uuid4().hex}"
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            r = str(uuid.uuid4())
            raw = Raw(client, r)
            client.send(shell(r, f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 1000"))
            await raw.until(lambda e: e.WhichOneof("event_type") == "log" and e.log.fields.get("reason") == "queued", timeout=30)
            _kill(cluster.gateway)
        await asyncio.sleep(1)  # the gateway has been silent for a while when the worker starts
        worker = cluster.add_worker()
        assert await asyncio.to_thread(wait_until, pidfile.exists, 30), "the command was not run"
        (pid,) = host_pids(None, [int(pidfile.read_text())], str(pidfile))  # printed in its pid namespace
        assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 30), "the dead gateway's command outlived its lease"
        assert await asyncio.to_thread(wait_until, lambda: _gone_lines(worker), 10)
        [line] = _gone_lines(worker)
        assert line["gateway"] == "gw-early" and line["heard"] is False and len(line["sessions"]) == 1
        assert line["silent_seconds"] >= 2  # the lease (2 s), counted from its arrival
    finally:
        cluster.stop()
