"""Batching over NATS (PROTOCOL.md, "Messages", "Batches"; for throughput): a session's commands of
one loop iteration travel as one command message, a worker's event messages of one iteration for one
session as one NATS message, and the guarantees stay those of single messages: every request
answered exactly once, its events in order, and a batch redelivered after its worker died ends each
request once.

Real parts: nats-server, ``smith-fast gateway`` and ``worker`` processes (harness/nats_cluster.py),
the SDK over the gateway's Unix socket; the command stream's own figures (JetStream stream info)
show how many command messages were stored.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import uuid

import nats
import pytest

from harness.nats_cluster import Cluster, NatsServer
from smith_fast.client import Client
from smith_fast.framing import encode_frames
from smith_fast.nats.batching import MAX_BATCH_COMMANDS, CommandBatcher, SharedStream, batch_limit, split_commands, split_events
from smith_fast.nats.config import NatsConfig
from smith_fast.nats.jetstream import Publisher, ensure_streams, message_size
from smith_fast.nats.presence import Announcement
from smith_fast.nats.wire import COMMANDS, MSG_ID, PARTS, CommandMeta
from smith_fast.pb import smith_pb2 as pb

from .test_nats import HOOK, NATS_FAST, _collect, _output, _restarted, _shell, _terminals, _tool

# ---- the wire forms ---------------------------------------------------------------------------------


def test_split_commands() -> None:
    one = b"\x0a\x02hi"
    assert split_commands({MSG_ID: "s.1"}, one, 1 << 20) == [one]  # unbatched: the payload itself
    frames = [b"a" * 3, b"", b"b" * 300]
    assert split_commands({MSG_ID: "s.1", COMMANDS: "3"}, encode_frames(frames), 1 << 20) == frames
    with pytest.raises(ValueError, match="says 2 commands"):
        split_commands({COMMANDS: "2"}, encode_frames(frames), 1 << 20)
    with pytest.raises(ValueError):
        split_commands({COMMANDS: "1"}, encode_frames([b"abc"])[:-1], 1 << 20)  # cut short


def test_split_events() -> None:
    assert split_events({MSG_ID: "sess.4.2.7"}, b"x", 1 << 20) == [(4, 2, 7, b"x", 0)]
    parts = {MSG_ID: "sess.4.1.1+2", PARTS: "4.1.1,5.1.3"}
    assert split_events(parts, encode_frames([b"x", b"yz"]), 1 << 20) == [(4, 1, 1, b"x", 0), (5, 1, 3, b"yz", 0)]
    # the stream of a batch run in one session: its first number and its count
    shared = {MSG_ID: "sess.b6-3.2.1+2", PARTS: "b6-3.2.1,7.1.4"}
    assert split_events(shared, encode_frames([b"x", b"y"]), 1 << 20) == [(6, 2, 1, b"x", 3), (7, 1, 4, b"y", 0)]
    with pytest.raises(ValueError, match="how many"):
        split_events({PARTS: "b6-0.1.1"}, encode_frames([b"x"]), 1 << 20)
    with pytest.raises(ValueError, match="names 2 parts"):
        split_events(parts, encode_frames([b"x"]), 1 << 20)
    with pytest.raises(ValueError):
        split_events({PARTS: "4.1"}, encode_frames([b"x"]), 1 << 20)


def test_batch_limit_follows_the_smallest_worker() -> None:
    assert batch_limit([]) == 1  # no worker known: one command a message
    assert batch_limit([2, 64]) == 1  # a worker running two at a time gets no batches it cannot run
    assert batch_limit([32, 64]) == 8
    assert batch_limit([100_000]) == MAX_BATCH_COMMANDS


# ---- end to end -------------------------------------------------------------------------------------


async def _stored_commands(cluster: Cluster) -> int:
    """Command messages the command stream stored so far (its last sequence number)."""
    nc = await nats.connect(cluster.nats.url)
    try:
        info = await nc.jetstream().stream_info("SMITH_CMD")
        return int(info.state.last_seq)
    finally:
        await nc.close()


async def _dispatched_by_worker(cluster: Cluster) -> dict[str, int]:
    """Each worker's ``dispatched`` count, from the presence announcements they answer a query with."""
    nc = await nats.connect(cluster.nats.url)
    heard: dict[str, int] = {}
    try:
        async def take(msg: nats.aio.msg.Msg) -> None:
            ann = Announcement.decode(msg.data)
            heard[ann.worker] = ann.dispatched

        await nc.subscribe("smith.presence", cb=take)
        await nc.publish("smith.presence.query", b"")
        for _ in range(100):
            if len(heard) >= len(cluster.workers):
                break
            await asyncio.sleep(0.05)
        return heard
    finally:
        await nc.close()


@pytest.fixture
def wide(tmp_path: pathlib.Path) -> Cluster:
    """Two workers running 32 commands at a time each: batches of up to 8 commands."""
    c = Cluster(tmp_path, workers=2, nats_args=NATS_FAST, worker_args=("--concurrency", "32")).start()
    (c.root / "small.txt").write_text("a small file\n")
    try:
        yield c  # type: ignore[misc]  # a generator fixture
    finally:
        c.stop()


async def test_pipelined_calls_through_two_workers_are_batched_and_answered_once(wide: Cluster) -> None:
    calls = 400
    async with await Client.connect(wide.unix) as client:
        await client.handshake(["shell_exec"])
        cmds = [_tool("fs.read", {"path": "small.txt"}) for _ in range(calls)]
        results = await asyncio.gather(*(_collect(client, c) for c in cmds))
        # a second wave on the same session once the first is done: numbering goes on across batches
        more = [_shell(f"echo {i}") for i in range(40)]
        shells = await asyncio.gather(*(_collect(client, c) for c in more))
    for cmd, events in zip(cmds, results):
        rid = cmd.tool_call.request_id
        assert _terminals(events, rid) == [pb.SERVICE_STATE_READY]
        tool = [e.tool_result for e in events if e.WhichOneof("event_type") == "tool_result"]
        assert len(tool) == 1 and tool[0].success and tool[0].request_id == rid
        assert json.loads(tool[0].result)["content"] == "a small file\n"
        processing = [e for e in events if e.WhichOneof("event_type") == "state_change"
                      and e.state_change.state == pb.SERVICE_STATE_PROCESSING]
        assert len(processing) == 1 and events.index(processing[0]) < events.index(next(
            e for e in events if e.WhichOneof("event_type") == "tool_result"))
        assert all(not _restarted(e) for e in events)
    for i, (cmd, events) in enumerate(zip(more, shells)):
        assert _terminals(events, cmd.shell_exec.request_id) == [pb.SERVICE_STATE_READY]
        assert _output(events) == (f"{i}\n", "", 0)
    stored = await _stored_commands(wide)
    assert stored < (calls + len(more)) // 2, f"{stored} command messages for {calls + len(more)} commands: not batched"
    dispatched = await _dispatched_by_worker(wide)
    assert sum(dispatched.values()) == calls + len(more), dispatched  # each command run once
    assert len(dispatched) == 2 and all(dispatched.values()), dispatched  # both workers took some


@pytest.fixture
def single(tmp_path: pathlib.Path) -> Cluster:
    """One worker (32 at a time: batches of up to 8), without the sandbox: a command kills it."""
    c = Cluster(tmp_path, workers=1, nats_args=NATS_FAST, worker_args=("--concurrency", "32", "--sandbox", "off")).start()
    try:
        yield c  # type: ignore[misc]  # a generator fixture
    finally:
        c.stop()


async def test_batch_redelivered_after_its_worker_died_ends_each_request_once(single: Cluster) -> None:
    """Eight commands in flight on one worker; one of them SIGKILLs the worker while the others
    run. The batch goes to a new worker after the ack wait and runs again: each request still
    ends exactly once, READY, with the output of its last run."""
    cluster = single
    marker = cluster.root / f"ran-{uuid.uuid4().hex}"
    killer = f"echo start; if mkdir {marker} 2>/dev/null; then sleep 0.5; kill -KILL $PPID; sleep 5; fi; echo done"
    cmds = [_shell("echo start; sleep 1; echo done") for _ in range(7)] + [_shell(killer)]
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        waiting = asyncio.gather(*(_collect(client, c) for c in cmds))
        assert await asyncio.to_thread(lambda: cluster.workers[0].proc.wait(30)) == -9  # type: ignore[union-attr]
        cluster.workers.clear()
        cluster.add_worker()
        results = await waiting
    assert await _stored_commands(cluster) < len(cmds)  # they travelled in batches
    restarted = 0
    for cmd, events in zip(cmds, results):
        assert _terminals(events, cmd.shell_exec.request_id) == [pb.SERVICE_STATE_READY]
        assert _output(events) == ("start\ndone\n", "", 0)
        restarted += any(_restarted(e) for e in events)
    assert restarted >= 1  # a batch was taken back from the dead worker and ran again


async def test_command_batches_keep_to_max_payload_with_long_headers(tmp_path: pathlib.Path) -> None:
    """A session with many hooks has long headers: batches are cut so that each message, headers
    included, fits the server's max_payload; every command is stored, none refused."""
    conf = tmp_path / "nats.conf"
    conf.write_text("max_payload: 4096\n")
    server = NatsServer(tmp_path / "store", extra=("-c", str(conf))).start()
    try:
        config = NatsConfig(servers=(server.url,))
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await ensure_streams(js, config)
            publisher = Publisher(nc)
            await publisher.start()
            batcher = CommandBatcher(publisher, lambda session: config.command_subject("gw", session), max_commands=MAX_BATCH_COMMANDS)
            hooks = tuple(f"{i:064x}" for i in range(30))  # ~2 KiB of Smith-Hooks
            payload = b"\x52" + b"x" * 400
            futures = [batcher.add(CommandMeta("sess", n, "smith.evt.gw.sess", frozenset({1}), hooks), payload, None)
                       for n in range(1, 21)]
            seqs = await asyncio.gather(*futures)
            info = await js.stream_info(config.command_stream)
            assert info.state.messages == len(set(seqs)) > 1  # several messages, each stored
            total = 0
            for seq in sorted(set(seqs)):
                stored = await js.get_msg(config.command_stream, seq)
                headers = dict(stored.headers or {})
                assert message_size(stored.data or b"", headers) <= 4096
                total += len(split_commands(headers, stored.data or b"", 1 << 20))
            assert total == 20
            await publisher.close()
        finally:
            await nc.close()
    finally:
        server.stop()


def _state(rid: str, state: int) -> pb.Event:
    event = pb.Event()
    event.state_change.request_id = rid
    event.state_change.state = state
    return event


def _out(rid: str, text: str) -> pb.Event:
    event = pb.Event()
    event.shell_output.request_id = rid
    event.shell_output.stdout = text
    return event


def test_shared_stream_splits_a_batch_session_by_request() -> None:
    """The events of a batch run in one worker session come back per request, in order, each run
    numbered as the request's own event messages would be; duplicates and early arrivals are
    handled once for the stream; a newer attempt starts every request's numbering again."""
    stream = SharedStream({"a": 1, "b": 2})
    processing, ready = pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY
    second = [_out("b", "b1\n"), _out("a", "a1\n"), _state("a", ready)]
    assert stream.push(1, 2, second) == []  # early: held until part 1 came
    first = [_state("a", processing), _state("b", processing)]
    runs = stream.push(1, 1, first)
    assert [(n, at, len(evs)) for n, at, evs in runs] == [(1, 1, 1), (2, 1, 2), (1, 2, 2)]  # runs span parts
    assert stream.push(1, 1, first) == []  # a duplicate
    session_wide = pb.Event()
    session_wide.state_change.state = pb.SERVICE_STATE_SHUTTING
    assert [(n, at) for n, at, _ in stream.push(1, 3, [session_wide, _state("b", ready)])] == [(None, 0), (2, 2)]
    again = stream.push(2, 1, first)  # redelivered: numbering starts over for the new attempt
    assert [(n, at) for n, at, _ in again] == [(1, 1), (2, 1)]
    assert stream.push(1, 4, [_out("a", "late")]) == []  # the older attempt is over
    # a request the gateway ended before the stream began (it is not among the numbers): dropped
    assert [(n, at) for n, at, _ in stream.push(2, 2, [_out("gone", "x"), _out("a", "a2\n")])] == [(1, 2)]


async def test_acks_sent_together_are_not_lost_when_the_worker_stops(tmp_path: pathlib.Path) -> None:
    """Acknowledgements leave together a moment after their commands ended; a worker stopped
    (SIGTERM) right after its last answer still sends them: nothing it finished stays in the
    command stream to run again."""
    cluster = Cluster(tmp_path, workers=1, nats_args=NATS_FAST, worker_args=("--concurrency", "32")).start()
    try:
        (cluster.root / "small.txt").write_text("a small file\n")
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            cmds = [_tool("fs.read", {"path": "small.txt"}) for _ in range(50)]
            results = await asyncio.gather(*(_collect(client, c) for c in cmds))
            assert all(_terminals(ev, c.tool_call.request_id) == [pb.SERVICE_STATE_READY] for c, ev in zip(cmds, results))
            assert cluster.workers[0].stop() == 0  # at once, within the acks' delay
        nc = await nats.connect(cluster.nats.url)
        try:
            info = await nc.jetstream().stream_info("SMITH_CMD")
        finally:
            await nc.close()
        assert info.state.messages == 0 and info.state.last_seq >= 1, info.state  # all acknowledged, so removed
    finally:
        cluster.stop()


async def test_a_batch_with_a_hook_load_and_later_commands(wide: Cluster) -> None:
    """A HookLoad pipelined with other commands travels in their batch, which then runs a session
    per command (the hook must not change what the batch's other commands see); every request
    ends once, and the session's commands after the load carry the hook."""
    async with await Client.connect(wide.unix) as client:
        await client.handshake(["shell_exec", "hooks_js"])
        load = pb.Command()
        load.hook_load.request_id = str(uuid.uuid4())
        load.hook_load.hook_type = "js"
        load.hook_load.script = HOOK
        cmds = [load] + [_shell(f"echo plain {i}") for i in range(6)]
        results = await asyncio.gather(*(_collect(client, c) for c in cmds))
        later = await _collect(client, _shell("echo my secret"))
    for cmd, events in zip(cmds, results):
        kind = cmd.WhichOneof("command_type")
        assert _terminals(events, getattr(cmd, kind).request_id) == [pb.SERVICE_STATE_READY]
    for i, events in enumerate(results[1:]):
        assert _output(events) == (f"plain {i}\n", "", 0)
    assert _output(later) == ("my [redacted]\n", "", 0)
    assert await _stored_commands(wide) < len(cmds) + 1  # the load travelled with others


async def test_a_batch_that_outlasts_the_ack_wait_runs_once(single: Cluster) -> None:
    """Commands of one batch that run for several ack waits (2 s here) are kept by their worker's
    progress reports: each runs once and ends READY, with no redelivery (its notice would say
    so), and the worker saw no redelivery either."""
    async with await Client.connect(single.unix) as client:
        await client.handshake(["shell_exec"])
        cmds = [_shell(f"sleep 5; echo slow {i}") for i in range(3)]
        results = await asyncio.gather(*(_collect(client, c) for c in cmds))
    for i, (cmd, events) in enumerate(zip(cmds, results)):
        assert _terminals(events, cmd.shell_exec.request_id) == [pb.SERVICE_STATE_READY]
        assert not any(_restarted(e) for e in events)
        assert _output(events) == (f"slow {i}\n", "", 0)
    assert not [r for r in single.workers[0].logs if r.get("event") == "redelivered command done"]
