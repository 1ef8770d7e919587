"""A gateway restart loses no running request's events (PROTOCOL.md, "Gateway restart"): a gateway started with
``--gateway-id`` journals what its resumable sessions send (smith_fast.nats.journal); when it stops
(SIGTERM: it hands them over) or is killed (SIGKILL), the next gateway process with that id takes
those sessions over, the workers' requests running on meanwhile, and the peer resumes there with
its token and last sequence: every envelope once, in order, each request one terminal state.

Real parts only: nats-server on a loopback port, ``smith-fast gateway`` and ``worker`` processes,
the SDK client (``resume=True``) and raw v1 peers over the gateway's Unix socket. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import subprocess
import sys
import urllib.request
import uuid

import nats as nats_py
import pytest

from harness.nats_cluster import Cluster, logged, wait_gateway
from harness.server import SmithProcess, host_pids, pid_alive, wait_until
from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb

from .peers import kind
from .test_resume import Link, open_session, resume, shell

FAST = ("--ack-wait", "3", "--duplicate-window", "60", "--presence-interval", "0.3")
GATEWAY = ("--gateway-id", "gw-takeover", "--kill-grace", "1s", "--resume-window", "60s", "--metrics", "127.0.0.1:0")

LINES = 400  # a command printing a line every 10 ms: it runs for ~4 s, across the restart
STREAM = f"for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.01; done"
EXPECTED = "".join(f"line-{i}\n" for i in range(1, LINES + 1))


def _metrics(url: str) -> dict[str, float]:
    """The unlabelled figures of a Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in text.splitlines())
            if name and not name.startswith("#") and "{" not in name}


def restart(cluster: Cluster, sig: int) -> SmithProcess:
    """Stop the gateway with ``sig`` and start the same command line again (same id, same socket)."""
    old = cluster.gateway
    assert old.proc is not None
    if sig == signal.SIGKILL:
        old.proc.kill()
        old.proc.wait(10)
    else:
        assert old.stop(sig) == 0, old.raw_stderr[-30:]
    new = SmithProcess(cluster.tmp / "gw", *old.argv[3:]).start()
    cluster.gateway = new
    wait_gateway(new, len(cluster.workers))
    return new


async def _collect(client: Client, command: str, out: list[str], states: list[int], finals: list[int]) -> None:
    async for event in client.shell_exec(command):
        kind = event.WhichOneof("event_type")
        if kind == "shell_output":
            out.append(event.shell_output.stdout)
            if event.shell_output.finished:
                finals.append(event.shell_output.exit_code)
        elif kind == "state_change" and event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
            states.append(event.state_change.state)
            return


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_a_gateway_restart_loses_no_running_requests_events(tmp_path: pathlib.Path, sig: int) -> None:
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=GATEWAY).start()
    try:
        client = await Client.connect(cluster.unix, resume=True)
        await client.handshake(["shell_exec"])
        out: list[str] = []
        states: list[int] = []
        finals: list[int] = []
        quiet_out: list[str] = []
        quiet_states: list[int] = []
        quiet_finals: list[int] = []
        collecting = asyncio.gather(_collect(client, STREAM, out, states, finals),
                                    _collect(client, "sleep 2; echo quiet-done", quiet_out, quiet_states, quiet_finals))
        (cluster.root / "small.txt").write_text("small\n")
        calls: list[object] = []
        stop = asyncio.Event()

        async def calling() -> None:  # tool calls all along, the restart among them
            while not stop.is_set():
                try:
                    calls.append(await client.tool("fs.read", {"path": "small.txt"}))
                except SmithError as exc:
                    calls.append(exc)

        caller = asyncio.ensure_future(calling())
        for _ in range(3000):
            if len("".join(out)) > 200:
                break
            await asyncio.sleep(0.01)
        assert len("".join(out)) > 200, "no output before the restart"
        new = await asyncio.to_thread(restart, cluster, sig)
        await asyncio.wait_for(collecting, 90)
        stop.set()
        await asyncio.wait_for(caller, 60)  # every call ended
        failed = [c for c in calls if isinstance(c, SmithError)]
        print(f"{len(calls)} tool calls across the restart, {len(failed)} failed")
        assert len(calls) > 10
        # A stopping gateway lets its commands reach the stream before it hands over: none lost.
        # A killed one may have admitted a call it had not queued: that one ends gateway_restarted.
        if sig == signal.SIGTERM:
            assert not failed, failed
        assert all(e.details.get("reason") == "gateway_restarted" for e in failed), failed
        assert client.resumes >= 1
        assert "".join(out) == EXPECTED
        assert states == [pb.SERVICE_STATE_READY] and finals == [0]
        assert "".join(quiet_out) == "quiet-done\n" and quiet_states == [pb.SERVICE_STATE_READY] and quiet_finals == [0]
        assert logged(new, "session taken over") == 1
        figures = await asyncio.to_thread(_metrics, new.metrics_url)
        assert figures["smith_fast_nats_sessions_taken_over_total"] == 1 and figures["smith_fast_nats_journal_sessions"] == 1, figures
        assert figures["smith_fast_nats_journal_messages_total"] > 0
        # the session goes on on the new process: a new request runs
        result = await client.run("echo after")
        assert result.exit_code == 0 and result.stdout == b"after\n"
        # New requests are numbered past all the process before had reserved in its journal (a
        # number it used after its last snapshot, given again, would make JetStream drop the new
        # command and its events as duplicates of the old ones: the request would never end).
        numbers = [int(r["peer"].rpartition("/")[2]) for r in cluster.workers[0].logs
                   if r.get("event") == "request" and str(r.get("peer", "")).startswith("nats:")]
        assert max(numbers) > 1 << 16, numbers[-5:]
        await client.close()
    finally:
        cluster.stop()


async def test_batched_commands_survive_two_restarts(tmp_path: pathlib.Path) -> None:
    """Commands sent in one loop iteration travel as one NATS message and run in one worker
    session (a batch, whose events the gateway splits: SharedStream); their progress is journaled
    too. Killed, then stopped: each command's output arrives whole and once."""
    cluster = Cluster(tmp_path, workers=2, nats_args=FAST, gateway_args=GATEWAY).start()
    try:
        client = await Client.connect(cluster.unix, resume=True)
        await client.handshake(["shell_exec"])
        count = 3
        outs: list[list[str]] = [[] for _ in range(count)]
        states: list[list[int]] = [[] for _ in range(count)]
        finals: list[list[int]] = [[] for _ in range(count)]
        collecting = asyncio.gather(*(_collect(client, STREAM, outs[i], states[i], finals[i]) for i in range(count)))
        seen = 0
        for sig in (signal.SIGKILL, signal.SIGTERM):
            for _ in range(3000):
                if min(len("".join(o)) for o in outs) > seen + 100:
                    break
                await asyncio.sleep(0.01)
            seen = min(len("".join(o)) for o in outs)
            await asyncio.to_thread(restart, cluster, sig)
        await asyncio.wait_for(collecting, 120)
        assert client.resumes >= 2
        for i in range(count):
            assert "".join(outs[i]) == EXPECTED, i
            assert states[i] == [pb.SERVICE_STATE_READY] and finals[i] == [0], i
        await client.close()
    finally:
        cluster.stop()


async def test_sessions_not_taken_over_end_on_the_workers(tmp_path: pathlib.Path) -> None:
    """A session that did not ask for resume dies with a killed gateway; the next process with
    its id tells the workers which sessions it took over, and they end the others' commands at
    once (a `sleep` sends no event that could make the new gateway notice it)."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=GATEWAY).start()
    try:
        plain = await Client.connect(cluster.unix)
        await plain.handshake(["shell_exec"])
        kept = await Client.connect(cluster.unix, resume=True)
        await kept.handshake(["shell_exec"])
        pid: list[int] = []

        async def sleeper() -> None:  # follows it to its end (a generator closed early cancels its request)
            with contextlib.suppress(Exception):
                async for event in plain.shell_exec("echo pid=$$; exec sleep 1000"):
                    if event.WhichOneof("event_type") == "shell_output" and event.shell_output.stdout.startswith("pid="):
                        inner = int(event.shell_output.stdout.strip().removeprefix("pid="))  # its pid namespace's
                        pid.extend(host_pids(None, [inner], "echo pid=$$; exec sleep 1000"))

        sleeping = asyncio.ensure_future(sleeper())
        for _ in range(3000):
            if pid:
                break
            await asyncio.sleep(0.01)
        assert pid, "the sleep did not start"
        kept_out: list[str] = []
        kept_states: list[int] = []
        kept_finals: list[int] = []
        following = asyncio.ensure_future(_collect(kept, "sleep 2; echo kept", kept_out, kept_states, kept_finals))
        await asyncio.sleep(0.5)
        assert pid_alive(pid[0])
        await asyncio.to_thread(restart, cluster, signal.SIGKILL)
        worker = cluster.workers[0]
        assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid[0]), 30), "the sleep of the session nobody took over still runs"
        assert logged(worker, "gateway restarted: ending the sessions it did not take over") == 1
        await asyncio.wait_for(following, 60)
        assert "".join(kept_out) == "kept\n" and kept_states == [pb.SERVICE_STATE_READY] and kept_finals == [0]
        await kept.close()
        sleeping.cancel()
        with contextlib.suppress(BaseException):
            await sleeping
        with contextlib.suppress(Exception):
            await plain.close()
    finally:
        cluster.stop()


async def test_a_session_nobody_resumes_ends_after_the_window(tmp_path: pathlib.Path) -> None:
    """Taken over by the next process and parked, a session whose peer never comes back ends when
    the new process's --resume-window passes: its command is killed on the worker, its journal
    purged, and a late resume is told the session is gone."""
    window = ("--resume-window", "2s")
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=(*GATEWAY, *window)).start()
    try:
        link, token, _ = await open_session(cluster.tcp)
        link.send(shell(str(uuid.uuid4()), "echo pid=$$; exec sleep 1000"))
        pid = 0
        last = 0
        while not pid:
            env = await asyncio.wait_for(link.recv(), 30)
            last = env.sequence or last
            if kind(env) == "shell_output" and env.event.shell_output.stdout.startswith("pid="):
                (pid,) = host_pids(None, [int(env.event.shell_output.stdout.strip().removeprefix("pid="))], "echo pid=$$; exec sleep 1000")
        new = await asyncio.to_thread(restart, cluster, signal.SIGKILL)
        await link.aclose()  # the peer is gone too
        assert logged(new, "session taken over") == 1 and pid_alive(pid)
        assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 30), "the abandoned session's command still runs"
        assert logged(new, "resume window passed") == 1
        late = await Link.open(new.tcp)
        late.send(resume(token, last))
        env = await asyncio.wait_for(late.recv(), 30)
        assert kind(env) == "error" and env.event.error.details["reason"] == "resume_unknown"
        await late.aclose()
        nats = await nats_py.connect(cluster.nats.url)
        try:
            info = await nats.jetstream().stream_info("SMITH_OUT", subjects_filter="smith.out.gw-takeover.*")
            assert not (info.state.subjects or {}), info.state.subjects
        finally:
            await nats.close()
    finally:
        cluster.stop()


def test_a_second_process_with_the_same_gateway_id_refuses_to_serve(tmp_path: pathlib.Path) -> None:
    """Two gateway processes with one id would split its events: the second says so and does
    not serve (its health names the first); the first goes on."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=GATEWAY).start()
    try:
        (tmp_path / "gw2").mkdir()
        argv = [a if a != str(tmp_path / "gw" / "smith.sock") else str(tmp_path / "gw2" / "smith.sock") for a in cluster.gateway.argv[3:]]
        second = SmithProcess(tmp_path / "gw2", *argv).start()
        try:
            assert wait_until(lambda: logged(second, "cannot use NATS") == 1, 20), second.raw_stderr[-20:]
            error = next(r["error"] for r in second.logs if r.get("event") == "cannot use NATS")
            assert "another gateway process" in error and "--gateway-id gw-takeover" in error, error
            assert f":{cluster.gateway.pid}" in error, error  # it names the one running
            assert logged(second, "nats connected") == 0
        finally:
            second.stop()

        async def still_serves() -> None:
            client = await Client.connect(cluster.unix)
            await client.handshake(["shell_exec"])
            result = await client.run("echo first")
            assert result.exit_code == 0 and result.stdout == b"first\n"
            await client.close()

        asyncio.run(still_serves())
    finally:
        cluster.stop()


def test_cli_exec_carries_on_across_a_gateway_restart(tmp_path: pathlib.Path) -> None:
    """`smith-fast exec --connect` resumes its session: the gateway restarts under it, the
    command's output arrives whole and once, and exec exits with the command's code."""
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=GATEWAY).start()
    try:
        command = f"{STREAM}; exit 3"
        proc = subprocess.Popen([sys.executable, "-m", "smith_fast", "exec", "--connect", cluster.unix, command],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # it runs
        assert first == b"line-1\n", first
        restart(cluster, signal.SIGTERM)
        rest, err = proc.communicate(timeout=90)
        assert proc.returncode == 3, err.decode()
        assert (first + rest).decode() == EXPECTED, err.decode()
        assert b"Traceback" not in err
    finally:
        cluster.stop()


async def test_the_journal_of_a_flooding_session_stays_bounded(tmp_path: pathlib.Path) -> None:
    """A session that sends 24 MB keeps about twice --max-session-buffer in the journal stream,
    not all of it (NATS's disk is the gateway's memory here), and is still taken over after it."""
    limit = 2 << 20
    cluster = Cluster(tmp_path, workers=1, nats_args=FAST, gateway_args=(*GATEWAY, "--max-session-buffer", str(limit))).start()
    try:
        client = await Client.connect(cluster.unix, resume=True)
        await client.handshake(["shell_exec"])
        result = await client.run("head -c 24000000 /dev/zero | tr '\\\\0' a")
        assert result.exit_code == 0 and len(result.stdout) == 24_000_000
        nats = await nats_py.connect(cluster.nats.url)
        try:
            js = nats.jetstream()
            for _ in range(200):  # purges are sent in the background
                kept = (await js.stream_info("SMITH_OUT")).state.bytes
                if kept <= 3 * limit:
                    break
                await asyncio.sleep(0.05)
            print(f"journal holds {kept:,} bytes after 24,000,000 sent (--max-session-buffer {limit:,})")
            assert kept <= 3 * limit
        finally:
            await nats.close()
        await asyncio.to_thread(restart, cluster, signal.SIGTERM)
        again = await client.run("echo still")
        assert again.exit_code == 0 and again.stdout == b"still\n" and client.resumes >= 1
        await client.close()
    finally:
        cluster.stop()
