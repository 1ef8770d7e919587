"""What happens to sessions when a worker, a gateway or the NATS server goes away: real processes.

The rules (PROTOCOL.md, "Scale-out over NATS", "Failures"): a command is never run twice by the
system (nothing is queued or redelivered); a worker's death ends each open request of its sessions
once (``worker_gone``) and the session, within three presence intervals; a draining worker ends
what outlasts ``--drain-timeout``; a resumable session outlives its gateway (any gateway resumes it:
the worker holds it); a lost relay message ends the relay, which a resumable session survives.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import time
import uuid

import pytest

from harness.nats_cluster import Cluster, wait_gateway
from harness.server import SmithProcess, host_pids, pid_alive, wait_until
from smith_fast.client import Client
from smith_fast.errors import ConnectionClosed, SmithError
from smith_fast.pb import smith_pb2 as pb

PRESENCE = 0.3  # workers announce this often; a gateway takes one silent for 3 intervals as gone
FAST = ("--presence-interval", str(PRESENCE))
TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)


async def _events(client: Client, command: pb.Command, rid: str, out: list[pb.Event]) -> None:
    """Every event of request ``rid`` into ``out``, until its terminal state or the connection's end."""
    queue = client._route(rid)  # noqa: SLF001  (the SDK's own per-request routing)
    client.send(command)
    try:
        while True:
            event = await queue.get()
            if event is None:
                return
            out.append(event)
            if event.WhichOneof("event_type") == "state_change" and event.state_change.state in TERMINAL:
                return
    finally:
        client._routes.pop(rid, None)  # noqa: SLF001


def _shell(command: str) -> tuple[pb.Command, str]:
    rid = str(uuid.uuid4())
    cmd = pb.Command()
    cmd.shell_exec.request_id = rid
    cmd.shell_exec.command = command
    return cmd, rid


def _terminals(events: list[pb.Event], rid: str) -> list[int]:
    return [e.state_change.state for e in events if e.WhichOneof("event_type") == "state_change"
            and e.state_change.request_id == rid and e.state_change.state in TERMINAL]


def _reasons(events: list[pb.Event]) -> list[str]:
    return [e.error.details.get("reason", "") for e in events if e.WhichOneof("event_type") == "error"]


async def test_a_killed_workers_requests_end_once_each_and_the_other_sessions_carry_on(tmp_path: pathlib.Path) -> None:
    cluster = Cluster(tmp_path, workers=3, nats_args=FAST).start()
    clients: list[Client] = []
    try:
        placed: dict[str, list[Client]] = {}
        for _ in range(6):
            client = await Client.connect(cluster.unix)
            ready = await client.handshake(["shell_exec"])
            placed.setdefault(ready.service_info["smith_fast.worker"], []).append(client)
            clients.append(client)
        victim = max(placed, key=lambda w: len(placed[w]))
        runs = cluster.root / "runs"
        runs.mkdir()
        started: list[tuple[Client, str, list[pb.Event], asyncio.Task[None]]] = []
        for client in clients:
            cmd, rid = _shell(f'echo x >> "{runs}/$RUN_ID"; sleep 100')
            cmd.shell_exec.env["RUN_ID"] = rid
            out: list[pb.Event] = []
            started.append((client, rid, out, asyncio.ensure_future(_events(client, cmd, rid, out))))
        assert await asyncio.to_thread(wait_until, lambda: len(list(runs.iterdir())) == 6, 10)
        n = int(victim.removeprefix("w"))
        os.kill(cluster.workers[n].pid, signal.SIGKILL)
        killed = time.monotonic()
        bound = 3 * PRESENCE + 0.5 + 3.0  # the expiry, the sweep, and a loaded machine's slack
        mine = [s for s in started if s[0] in placed[victim]]
        await asyncio.wait_for(asyncio.gather(*(s[3] for s in mine)), bound)
        took = time.monotonic() - killed
        for _client, rid, out, _task in mine:
            assert _terminals(out, rid) == [pb.SERVICE_STATE_ERROR], out
            assert _reasons(out) == ["worker_gone"]
        for client, *_ in mine:  # the session ended: the SDK says so, and a new session works
            with pytest.raises((ConnectionClosed, SmithError)):
                await asyncio.wait_for(client.run("true"), 10)
        async with await Client.connect(cluster.unix) as fresh:
            ready = await fresh.handshake(["shell_exec"])
            assert ready.service_info["smith_fast.worker"] != victim
            assert (await fresh.run("echo again")).stdout == b"again\n"
        # the other sessions did not notice: their commands still run, and they take new ones
        others = [s for s in started if s[0] not in placed[victim]]
        assert others and not any(s[3].done() for s in others)
        for client, *_ in others:
            assert (await client.run("echo on")).stdout == b"on\n"
        # nothing was run twice: one line per request in the runs file
        assert sorted(p.read_text() for p in runs.iterdir()) == ["x\n"] * 6
        print(f"\nworker_gone after {took:.2f} s (bound {bound:.1f} s)")
    finally:
        for client in clients:
            await client.close()
        cluster.stop()


async def test_a_draining_worker_finishes_what_fits_refuses_new_requests_and_ends_the_rest(tmp_path: pathlib.Path) -> None:
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, worker_args=("--drain-timeout", "3")).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            short_cmd, short = _shell("sleep 1; echo short")
            long_cmd, long = _shell("echo long; sleep 60")
            short_out: list[pb.Event] = []
            long_out: list[pb.Event] = []
            tasks = [asyncio.ensure_future(_events(client, short_cmd, short, short_out)),
                     asyncio.ensure_future(_events(client, long_cmd, long, long_out))]
            await asyncio.sleep(0.3)
            worker = cluster.workers[0]
            worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            stopped = time.monotonic()
            assert await asyncio.to_thread(wait_until, lambda: any(r.get("event") == "drain timeout: ending what still runs"
                                                                  for r in worker.logs) or tasks[0].done(), 10)
            new_cmd, new = _shell("echo late")
            new_out: list[pb.Event] = []
            await asyncio.wait_for(_events(client, new_cmd, new, new_out), 10)
            assert _reasons(new_out) == ["worker_draining"] and _terminals(new_out, new) == [pb.SERVICE_STATE_ERROR]
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            ended = time.monotonic() - stopped
            assert _terminals(short_out, short) == [pb.SERVICE_STATE_READY]
            assert _terminals(long_out, long) == [pb.SERVICE_STATE_ERROR]
            assert 2.5 <= ended < 12, ended
            # then the session ends, saying why
            with pytest.raises((ConnectionClosed, SmithError)):
                await asyncio.wait_for(client.run("true"), 10)
        try:
            code = await asyncio.to_thread(worker.proc.wait, 20)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, [(r.get("event"), r.get("fields")) for r in worker.logs[-25:]]
    finally:
        cluster.stop()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_resumable_session_outlives_its_gateway_and_loses_or_repeats_nothing(tmp_path: pathlib.Path, sig: int) -> None:
    lease = ("--gateway-lease", "1")
    cluster = Cluster(tmp_path, workers=2, nats_args=(*FAST, *lease)).start()
    second = cluster.make_gateway().start()
    try:
        wait_gateway(second, 2)
        client = await Client.connect(cluster.unix, resume=True, resume_via=[second.unix])
        try:
            await client.handshake(["shell_exec"], accept=["resume"])
            count = 3000
            cmd, rid = _shell(f"for i in $(seq 1 {count}); do echo $i; [ $((i % 300)) = 0 ] && sleep 0.1; done")
            out: list[pb.Event] = []
            task = asyncio.ensure_future(_events(client, cmd, rid, out))
            while sum(1 for e in out if e.WhichOneof("event_type") == "shell_output") < 3:
                await asyncio.sleep(0.02)
            cluster.gateway.proc.send_signal(sig)  # type: ignore[union-attr]
            await asyncio.wait_for(task, 30)
            text = "".join(e.shell_output.stdout for e in out if e.WhichOneof("event_type") == "shell_output")
            assert text.split() == [str(i) for i in range(1, count + 1)]
            assert _terminals(out, rid) == [pb.SERVICE_STATE_READY]
            assert client._wire.resumes >= 1  # noqa: SLF001
            assert (await client.run("echo after")).stdout == b"after\n"
        finally:
            await client.close()
    finally:
        cluster.stop()


async def test_a_killed_gateways_other_sessions_end_on_their_worker_after_the_lease(tmp_path: pathlib.Path) -> None:
    """A session that cannot be resumed dies with its gateway: its worker hears no heartbeat for
    ``--gateway-lease`` and drops the connection, killing what it runs (no process outlives it)."""
    cluster = Cluster(tmp_path, workers=1, nats_args=(*FAST, "--gateway-lease", "1")).start()
    try:
        client = await Client.connect(cluster.unix)
        await client.handshake(["shell_exec"])
        pidfile = cluster.root / f"pid-{uuid.uuid4().hex}"
        cmd, _rid = _shell(f"echo $$ > {pidfile}; sleep 100")  # no exec: the shell, whose line names the pid file, stays
        client.send(cmd)
        assert await asyncio.to_thread(wait_until, lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), 10)
        (pid,) = host_pids(None, [int(pidfile.read_text())], str(pidfile))  # printed in its pid namespace
        os.kill(cluster.gateway.pid, signal.SIGKILL)
        worker = cluster.workers[0]
        assert await asyncio.to_thread(wait_until, lambda: any(r.get("event") == "gateway gone" for r in worker.logs), 10)
        assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 10), "the command outlived its gateway"
        await client.close()
    finally:
        cluster.stop()


async def test_a_nats_server_restart_carries_on_or_ends_with_a_reason(tmp_path: pathlib.Path) -> None:
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST).start()
    try:
        resumable = await Client.connect(cluster.unix, resume=True)
        plain = await Client.connect(cluster.unix)
        try:
            await resumable.handshake(["shell_exec"], accept=["resume"])
            await plain.handshake(["shell_exec"])
            count = 4000
            body = f"for i in $(seq 1 {count}); do echo $i; [ $((i % 200)) = 0 ] && sleep 0.1; done"
            runs = []
            for client in (resumable, plain):
                cmd, rid = _shell(body)
                out: list[pb.Event] = []
                runs.append((client, rid, out, asyncio.ensure_future(_events(client, cmd, rid, out))))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(cluster.nats.restart)
            await asyncio.wait_for(asyncio.gather(*(r[3] for r in runs)), 60)
            for client, rid, out, _ in runs:
                terminals = _terminals(out, rid)
                text = "".join(e.shell_output.stdout for e in out if e.WhichOneof("event_type") == "shell_output")
                numbers = text.split()
                assert numbers == [str(i) for i in range(1, len(numbers) + 1)], "output repeated or with a hole"
                if terminals == [pb.SERVICE_STATE_READY]:
                    assert len(numbers) == count  # it carried on (or resumed): all of it, once
                else:  # it ended, saying why; never a second terminal
                    assert terminals in ([pb.SERVICE_STATE_ERROR], []), terminals
                    assert terminals == [] or set(_reasons(out)) <= {"relay_lost", "worker_gone"}, _reasons(out)
            # the resumable one always completes: its worker kept it and it resumed
            assert _terminals(runs[0][2], runs[0][1]) == [pb.SERVICE_STATE_READY]
        finally:
            await resumable.close()
            await plain.close()
    finally:
        cluster.stop()


async def test_a_request_sent_while_nats_is_down_does_not_stop_the_next(tmp_path: pathlib.Path) -> None:
    # A request sent while the server is down waits in the gateway's NATS client and goes once it
    # reconnects, maybe before the worker subscribed again (then it is lost). The gateway does not
    # read the frontend while a DATA is unacknowledged (relay gathering): after the reconnect it
    # reads on, so the next request goes, and a lost one shows as a gap at the worker. Each request
    # ends (answered, or with relay_lost for the whole session); none hangs.
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST).start()
    try:
        client = await Client.connect(cluster.unix)
        try:
            await client.handshake(["shell_exec"])
            assert (await client.run("echo before")).stdout == b"before\n"
            await asyncio.to_thread(cluster.nats.stop)
            runs = []
            first, rid1 = _shell("echo first")
            out1: list[pb.Event] = []
            runs.append((rid1, out1, asyncio.ensure_future(_events(client, first, rid1, out1))))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(cluster.nats.start)
            await asyncio.sleep(1.0)  # reconnected (every 0.3 s at most, FAST)
            second, rid2 = _shell("echo second")
            out2: list[pb.Event] = []
            runs.append((rid2, out2, asyncio.ensure_future(_events(client, second, rid2, out2))))
            await asyncio.wait_for(asyncio.gather(*(r[2] for r in runs)), 60)
            for rid, out, _ in runs:
                terminals = _terminals(out, rid)
                if terminals != [pb.SERVICE_STATE_READY]:  # the relay lost a message: the session ends, saying why
                    assert terminals in ([pb.SERVICE_STATE_ERROR], []), terminals
                    assert set(_reasons(out)) <= {"relay_lost", "worker_gone"}, _reasons(out)
        finally:
            await client.close()
    finally:
        cluster.stop()


async def test_a_second_worker_with_the_same_id_stops_and_the_first_serves_on(tmp_path: pathlib.Path) -> None:
    """Two processes announcing one worker id would both answer its sessions' OPENs: the one
    started later says so and stops; the first keeps its sessions."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            first = cluster.workers[0]
            assert cluster.keys is not None
            (tmp_path / "twin").mkdir()
            twin = SmithProcess(tmp_path / "twin", "worker", *cluster.nats_args, "--worker-id", "w0", "--root", str(cluster.root),
                                "--nats-nkey", str(cluster.keys / "worker-w0.nk"), "--log-level", "debug")
            twin.launch()
            assert twin.proc is not None
            assert await asyncio.to_thread(twin.proc.wait, 20) == 2
            assert "--worker-id w0 is in use by a worker that runs already" in "\n".join(twin.raw_stderr)
            assert first.proc is not None and first.proc.poll() is None
            assert (await client.run("echo still")).stdout == b"still\n"
        async with await Client.connect(cluster.unix) as client:
            ready = await client.handshake(["shell_exec"])
            assert ready.service_info["smith_fast.worker"] == "w0"
            assert (await client.run("echo fresh")).stdout == b"fresh\n"
    finally:
        cluster.stop()


async def test_closing_a_nats_process_waits_a_bounded_time_for_its_tasks() -> None:
    """The way out of a stopping worker or gateway: a task that swallows a cancellation (as 3.11's
    asyncio.wait_for can, inside nats-py's flush) is cancelled again, and one that never ends is
    left after TASK_WAIT: close returns either way (the process exits)."""
    from smith_fast.nats import connect

    swallowed = 0

    async def swallows_once() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise

    released = False

    async def never_ends() -> None:  # until the test lets it (the test's own loop must end)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if released:
                    raise

    once = asyncio.ensure_future(swallows_once())
    stubborn = asyncio.ensure_future(never_ends())
    await asyncio.sleep(0)
    started = time.monotonic()
    await asyncio.wait_for(connect.close(None, [once, stubborn]), connect.TASK_WAIT + 5)
    assert once.cancelled() and swallowed == 2
    assert not stubborn.done() and connect.TASK_WAIT <= time.monotonic() - started < connect.TASK_WAIT + 5
    released = True
    stubborn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stubborn
