"""Operating the NATS scale-out: the gateway knows its workers, says when it cannot
serve, tells a frontend that its command waits, listens before NATS is reached, and shows its queue.

Real parts only: nats-server on a loopback port, ``smith-fast gateway`` and ``worker`` processes
(``harness/nats_cluster.py``), the SDK over the gateway's Unix socket, grpc.health.v1 over its gRPC
port, and its ``/metrics`` endpoint scraped over HTTP. No timing is asserted: every wait is for a
state (a log line, a health status, a figure), bounded only so that a broken build fails.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import urllib.request
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from harness.nats_cluster import Cluster, NatsServer, free_port, logged, wait_gateway
from harness.server import SmithProcess, wait_until
from smith_fast.client import Client
from smith_fast.nats.presence import Announcement, LiveSet
from smith_fast.pb import smith_pb2 as pb

FAST = ("--ack-wait", "2", "--duplicate-window", "60", "--presence-interval", "0.3")
NOT_SERVING = pb.HealthCheckResponse.SERVING_STATUS_NOT_SERVING
SERVING = pb.HealthCheckResponse.SERVING_STATUS_SERVING


def _shell(command: str) -> pb.Command:
    cmd = pb.Command()
    cmd.shell_exec.request_id = str(uuid.uuid4())
    cmd.shell_exec.command = command
    return cmd


def _final(event: pb.Event, rid: str) -> bool:
    return (
        event.WhichOneof("event_type") == "state_change"
        and event.state_change.request_id == rid
        and event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
    )


async def _until(queue: asyncio.Queue[pb.Event | None], pred: object, out: list[pb.Event]) -> pb.Event:
    """Read a request's events into ``out`` until one satisfies ``pred``; that one."""
    while True:
        event = await asyncio.wait_for(queue.get(), 60)
        assert event is not None, "connection closed"
        out.append(event)
        if pred(event):  # type: ignore[operator]
            return event


def _stdout(events: list[pb.Event]) -> str:
    return "".join(e.shell_output.stdout for e in events if e.WhichOneof("event_type") == "shell_output")


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


async def _grpc_health(address: str) -> int:
    async with grpc.aio.insecure_channel(address.removeprefix("grpc:")) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        return int(resp.status)


async def _wait_health(client: Client, status: int) -> pb.HealthCheckResponse:
    for _ in range(400):
        resp = await client.health_check()
        if resp.status == status:
            return resp
        await asyncio.sleep(0.05)
    raise AssertionError(f"health stayed {resp.status}: {dict(resp.metrics)}")


# ---- the live set, without NATS ------------------------------------------------------------------


def test_live_set_expires_silent_workers_and_drops_leaving_ones() -> None:
    now = [0.0]
    live = LiveSet(1.0, clock=lambda: now[0])
    assert live.heard(Announcement("w1", "1.0", 4)) and not live.heard(Announcement("w1", "1.0", 4, running=2))
    assert live.heard(Announcement("w2", "1.0", 8))
    assert [(a.worker, a.running) for a in live.alive()] == [("w1", 2), ("w2", 0)]
    now[0] = 2.5
    live.heard(Announcement("w2", "1.0", 8))
    now[0] = 3.5  # w1 silent for 3.5 s > 3 intervals
    assert [a.worker for a in live.alive()] == ["w2"]
    assert live.heard(Announcement("w2", "1.0", 8, leaving=True)) and len(live) == 0
    round_trip = Announcement("w3", "1.0", 2, running=1, acked=5, rtt=0.001)
    assert Announcement.decode(round_trip.encode()) == round_trip
    for bad in (b"", b"[]", b'{"worker": ""}', json.dumps({"worker": "w", "capacity": "x", "version": "1"}).encode()):
        try:
            Announcement.decode(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


# ---- no worker, then one ------------------------------------------------------------------------


async def test_no_worker_not_serving_queued_then_a_worker_runs_it(tmp_path: pathlib.Path) -> None:
    """With no worker: the handshake succeeds and says workers=0, health (in-stream and gRPC) is
    NOT_SERVING with a reason, a command gets a queued notice and /metrics shows it waiting; a
    worker starts, the command runs, health says SERVING and the figures follow."""
    cluster = Cluster(tmp_path, workers=0, nats_args=FAST, worker_args=("--metrics", "127.0.0.1:0"),
                      gateway_args=("--queue-notice", "0.2", "--metrics", "127.0.0.1:0")).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            ready = await client.handshake(["shell_exec"], accept=["health"])
            assert ready.service_info["smith_fast.workers"] == "0"
            assert ready.service_info["smith_fast.nats"] == "connected"
            assert "no worker is alive" in ready.service_info["smith_fast.not_serving_reason"]
            health = await client.health_check()
            assert health.status == NOT_SERVING and "no worker is alive" in health.metrics["not_serving_reason"]
            assert await _grpc_health(cluster.grpc) == health_pb2.HealthCheckResponse.NOT_SERVING

            cmd = _shell("echo ran-on-a-late-worker")
            rid = cmd.shell_exec.request_id
            queue = client._route(rid)  # noqa: SLF001  (the SDK's own per-request routing)
            client.send(cmd)
            events: list[pb.Event] = []
            notice = await _until(queue, lambda e: e.WhichOneof("event_type") == "log" or _final(e, rid), events)
            assert notice.WhichOneof("event_type") == "log", events
            assert notice.log.request_id == rid and notice.log.level == pb.LOG_LEVEL_WARN
            assert notice.log.fields["reason"] == "queued" and int(notice.log.fields["queue_depth"]) >= 1, notice.log
            assert notice.log.fields["workers"] == "0" and "no worker is alive" in notice.log.message

            url = cluster.gateway.metrics_url
            assert wait_until(lambda: _samples(url).get(("smith_fast_nats_queue_depth", frozenset()), 0) >= 1, 20), _samples(url)
            snap = _samples(url)
            assert snap[("smith_fast_nats_workers_alive", frozenset())] == 0
            assert snap[("smith_fast_nats_connected", frozenset())] == 1
            assert snap[("smith_fast_nats_commands_dispatched_total", frozenset())] >= 1

            cluster.add_worker()
            await _until(queue, lambda e: _final(e, rid), events)
            assert events[-1].state_change.state == pb.SERVICE_STATE_READY, events
            assert _stdout(events) == "ran-on-a-late-worker\n"
            health = await _wait_health(client, SERVING)
            assert "not_serving_reason" not in health.metrics
            assert wait_until(lambda: logged(cluster.gateway, "worker joined") >= 1, 20)

        async def grpc_serving() -> bool:
            for _ in range(400):
                if await _grpc_health(cluster.grpc) == health_pb2.HealthCheckResponse.SERVING:
                    return True
                await asyncio.sleep(0.05)
            return False

        assert await grpc_serving()
        worker = cluster.workers[0].proc
        assert worker is not None
        name = f"{socket.gethostname()}:{worker.pid}"
        assert wait_until(lambda: _samples(url).get(("smith_fast_nats_queue_depth", frozenset()), 1) == 0, 20)
        snap = _samples(url)
        assert snap[("smith_fast_nats_workers_alive", frozenset())] == 1
        assert snap[("smith_fast_nats_worker_capacity", frozenset({("worker", name)}))] >= 1
        assert ("smith_fast_nats_worker_running", frozenset({("worker", name)})) in snap
        assert snap[("smith_fast_nats_commands_acked_total", frozenset())] >= 1
        assert snap[("smith_fast_nats_events_relayed_total", frozenset())] >= 1
        assert snap[("smith_fast_nats_rtt_seconds", frozenset())] > 0
        # the worker's own /metrics: what it took, acknowledged and published
        mine = _samples(cluster.workers[0].metrics_url)
        assert mine[("smith_fast_nats_commands_dispatched_total", frozenset())] >= 1
        assert mine[("smith_fast_nats_commands_acked_total", frozenset())] >= 1
        assert mine[("smith_fast_nats_events_relayed_total", frozenset())] >= 1
        assert mine[("smith_fast_nats_connected", frozenset())] == 1
        assert mine[("smith_fast_nats_worker_capacity", frozenset())] >= 1

        # A worker that stops says so: health goes back to NOT_SERVING without waiting for expiry.
        cluster.workers[0].stop()
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"], accept=["health", "metrics"], metrics_interval_ms=50)
            health = await _wait_health(client, NOT_SERVING)
            assert "no worker is alive" in health.metrics["not_serving_reason"]
            wanted = {"smith_fast_nats_queue_depth", "smith_fast_nats_workers_alive", "smith_fast_nats_commands_dispatched_total",
                      "smith_fast_nats_rtt_seconds", "smith_fast_nats_commands_acked_total"}
            seen: dict[str, float] = {}
            for _ in range(10_000):  # in-stream MetricsEvents carry the same figures
                sample = await asyncio.wait_for(client.metrics.get(), 10)
                seen[sample.metric_name] = sample.value
                if wanted <= seen.keys():
                    break
            assert wanted <= seen.keys(), sorted(seen)
            assert seen["smith_fast_nats_workers_alive"] == 0
            assert seen["smith_fast_nats_commands_dispatched_total"] >= 1
    finally:
        cluster.stop()


async def test_queue_timeout_withdraws_the_command(tmp_path: pathlib.Path) -> None:
    """--queue-timeout: a command no worker takes fails with EXECUTION_TIMEOUT, reason queue_timeout,
    and leaves the stream (a worker starting later does not run it)."""
    cluster = Cluster(tmp_path, workers=0, nats_args=FAST, gateway_args=("--queue-notice", "0", "--queue-timeout", "0.5")).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake(["shell_exec"])
            marker = tmp_path / "root" / "ran"
            cmd = _shell(f"touch {marker}")
            rid = cmd.shell_exec.request_id
            queue = client._route(rid)  # noqa: SLF001
            client.send(cmd)
            events: list[pb.Event] = []
            await _until(queue, lambda e: _final(e, rid), events)
            errors = [e.error for e in events if e.WhichOneof("event_type") == "error"]
            assert [e.error_code for e in errors] == [pb.ERROR_CODE_EXECUTION_TIMEOUT], events
            assert errors[0].details["reason"] == "queue_timeout" and "--queue-timeout" in errors[0].message
            assert not any(e.WhichOneof("event_type") == "log" for e in events)  # --queue-notice 0: none
            cluster.add_worker()
            wait_gateway(cluster.gateway, workers=1)
            # the worker is alive and idle; the withdrawn command is not in the queue for it
            echo = [e async for e in client.shell_exec("echo after")]
            assert _stdout(echo) == "after\n"
            assert not marker.exists()
    finally:
        cluster.stop()


# ---- NATS down at the gateway's start -------------------------------------------------------------


async def test_gateway_listens_before_nats_is_up(tmp_path: pathlib.Path) -> None:
    """NATS down when the gateway starts: its socket is there at once, health says why, a command
    gets a clear ErrorEvent (nats_unavailable, retrying), the outage is logged once, not per retry;
    once NATS and a worker are up, commands run."""
    port = free_port()
    nats = NatsServer(tmp_path / "store", port=port)
    url = f"nats://127.0.0.1:{port}"
    (tmp_path / "gw").mkdir()
    sock = tmp_path / "gw" / "smith.sock"
    gateway = SmithProcess(tmp_path / "gw", "gateway", "--nats", url, *FAST, "--unix", str(sock), "--log-level", "debug")
    procs = [gateway]
    try:
        gateway.start()  # "ready" means listening: it comes without NATS
        assert sock.exists()
        async with await Client.connect(gateway.unix) as client:
            ready = await client.handshake(["shell_exec"], accept=["health"])
            assert ready.service_info["smith_fast.nats"] == "unreachable"
            assert "NATS is unreachable" in ready.service_info["smith_fast.not_serving_reason"]
            health = await client.health_check()
            assert health.status == NOT_SERVING and url in health.metrics["not_serving_reason"]
            assert "retrying" in health.metrics["not_serving_reason"]
            cmd = _shell("echo too-early")
            rid = cmd.shell_exec.request_id
            queue = client._route(rid)  # noqa: SLF001
            client.send(cmd)
            events: list[pb.Event] = []
            await _until(queue, lambda e: _final(e, rid), events)
            (error,) = [e.error for e in events if e.WhichOneof("event_type") == "error"]
            assert error.details["reason"] == "nats_unavailable", error
            assert url in error.message and "retrying" in error.message and "not queued" in error.message
            assert events[-1].state_change.state == pb.SERVICE_STATE_ERROR

        # Let several retries go by (every 0.5 s): one line said so, with the interval, not one per try.
        outage = {"nats unreachable, retrying", "nats connection failed, retrying"}
        assert wait_until(lambda: any(r.get("event") in outage for r in gateway.logs), 10), gateway.raw_stderr
        await asyncio.sleep(2)
        records = [r for r in gateway.logs if r.get("event") in outage]
        assert len(records) == 1, records
        assert float(records[0]["retry_interval"]) > 0 and "Connection refused" in records[0]["error"]
        assert not any(r.get("event") == "nats client error" for r in gateway.logs)
        assert [r["reason"] for r in gateway.logs if r.get("event") == "not serving"] == [health.metrics["not_serving_reason"]]

        nats.start()
        (tmp_path / "w").mkdir()
        (tmp_path / "root").mkdir()
        procs.append(SmithProcess(tmp_path / "w", "worker", "--nats", url, *FAST, "--root", str(tmp_path / "root")).start())
        wait_gateway(gateway, workers=1, timeout=30)
        async with await Client.connect(gateway.unix) as client:
            ready = await client.handshake(["shell_exec", "nats"], accept=["health"])
            assert pb.CAPABILITY_NATS in ready.capabilities and ready.service_info["smith_fast.workers"] == "1"
            assert (await _wait_health(client, SERVING)).status == SERVING
            assert _stdout([e async for e in client.shell_exec("echo in-service")]) == "in-service\n"
    finally:
        for proc in procs:
            if proc.proc is not None:
                proc.stop()
        nats.stop()
