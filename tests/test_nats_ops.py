"""Operating the NATS scale-out: the gateway knows its workers, says when it cannot serve, makes a
new session wait for a worker (and says so), listens before NATS is reached, and shows its figures.

Real parts only: nats-server on a loopback port, ``smith-fast gateway`` and ``worker`` processes
(``harness/nats_cluster.py``), the SDK over the gateway's Unix socket, and the ``/metrics``
endpoints scraped over HTTP. No timing is asserted: every wait is for a state (a log line, a
health status, a figure), bounded only so that a broken build fails.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness.nats_cluster import Cluster, NatsServer, free_port, logged, wait_gateway
from harness.server import SmithProcess, wait_until
import pytest

from smith_fast.client import Client, SmithError
from smith_fast.nats.presence import Announcement, LiveSet
from smith_fast.pb import smith_pb2 as pb

FAST = ("--presence-interval", "0.3")
NOT_SERVING = pb.HealthCheckResponse.SERVING_STATUS_NOT_SERVING
SERVING = pb.HealthCheckResponse.SERVING_STATUS_SERVING


def _stdout(events: list[pb.Event]) -> str:
    return "".join(e.shell_output.stdout for e in events if e.WhichOneof("event_type") == "shell_output")


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


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
    round_trip = Announcement("w3", "1.0", 2, running=1, sessions=3, labels={"zone": "b"}, draining=True, rtt=0.001)
    assert Announcement.decode(round_trip.encode()) == round_trip
    for bad in (b"", b"[]", b'{"worker": ""}', json.dumps({"worker": "w", "capacity": "x", "version": "1"}).encode(),
                json.dumps({"worker": "w", "capacity": 1, "version": "1", "labels": {"a": 1}}).encode()):
        try:
            Announcement.decode(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


# ---- no worker, then one ------------------------------------------------------------------------


async def _probe(address: str) -> pb.HealthCheckResponse:
    """A health check before any handshake: the gateway answers it itself."""
    async with await Client.connect(address) as client:
        return await asyncio.wait_for(client.health_check(), 10)


async def _wait_probe(address: str, status: int) -> pb.HealthCheckResponse:
    for _ in range(400):
        resp = await _probe(address)
        if resp.status == status:
            return resp
        await asyncio.sleep(0.05)
    raise AssertionError(f"health stayed {resp.status}: {dict(resp.metrics)}")


async def test_without_workers_the_gateway_says_so_and_a_session_waits_for_one(tmp_path: pathlib.Path) -> None:
    """No worker: a probe says NOT_SERVING and why, /metrics says 0 workers, a handshake waits
    with a notice; a worker starts, the waiting handshake is placed on it and runs, the probe says
    SERVING, both sides' figures follow; the worker stops and the probe says NOT_SERVING again."""
    cluster = Cluster(tmp_path, workers=0, nats_args=FAST, worker_args=("--metrics", "127.0.0.1:0"),
                      gateway_args=("--queue-notice", "0.2", "--queue-timeout", "60", "--metrics", "127.0.0.1:0")).start()
    try:
        health = await _probe(cluster.unix)
        assert health.status == NOT_SERVING and "no worker is alive" in health.metrics["not_serving_reason"]
        url = cluster.gateway.metrics_url
        assert url is not None
        snap = _samples(url)
        assert snap[("smith_fast_nats_workers_alive", frozenset())] == 0
        assert snap[("smith_fast_nats_connected", frozenset())] == 1

        async with await Client.connect(cluster.unix) as client:
            waiting = asyncio.ensure_future(client.handshake(["shell_exec"], accept=["health"]))
            await asyncio.sleep(0.6)
            assert not waiting.done()
            cluster.add_worker()
            ready = await asyncio.wait_for(waiting, 30)
            assert ready.service_info["smith_fast.worker"] == "w0"
            assert [n.fields["reason"] for n in client.notices] == ["placing"], client.notices
            assert "worker" in client.notices[0].message
            assert _stdout([e async for e in client.shell_exec("echo ran-on-a-late-worker")]) == "ran-on-a-late-worker\n"
            assert (await client.health_check()).status == SERVING  # the worker's own, in the session
            assert (await _wait_probe(cluster.unix, SERVING)).status == SERVING
            assert wait_until(lambda: _samples(url).get(("smith_fast_nats_worker_sessions", frozenset({("worker", "w0")})), 0) >= 1, 20)
            snap = _samples(url)
            assert snap[("smith_fast_nats_workers_alive", frozenset())] == 1
            assert snap[("smith_fast_nats_sessions", frozenset({("worker", "w0")}))] == 1
            assert snap[("smith_fast_nats_worker_capacity", frozenset({("worker", "w0")}))] >= 1
            assert snap[("smith_fast_nats_rtt_seconds", frozenset())] > 0
            worker_url = cluster.workers[0].metrics_url
            assert worker_url is not None
            mine = _samples(worker_url)
            assert mine[("smith_fast_nats_sessions_opened_total", frozenset())] >= 1
            assert mine[("smith_fast_nats_connected", frozenset())] == 1
            assert mine[("smith_fast_nats_worker_draining", frozenset())] == 0

        # A worker that stops says so: the probe says NOT_SERVING at once, without waiting for expiry.
        cluster.workers[0].stop()
        health = await _wait_probe(cluster.unix, NOT_SERVING)
        assert "no worker is alive" in health.metrics["not_serving_reason"]
    finally:
        cluster.stop()


# ---- NATS down at the gateway's start -------------------------------------------------------------


async def test_gateway_listens_before_nats_is_up(tmp_path: pathlib.Path) -> None:
    """NATS down when the gateway starts: its socket is there at once, a probe says why, a session
    waits and is told why it cannot be placed, the outage is logged once, not per retry; once NATS
    and a worker are up, sessions run."""
    port = free_port()
    nats = NatsServer(tmp_path / "store", port=port)
    url = f"nats://127.0.0.1:{port}"
    (tmp_path / "gw").mkdir()
    sock = tmp_path / "gw" / "smith.sock"
    gateway = SmithProcess(tmp_path / "gw", "gateway", "--nats", url, *FAST, "--unix", str(sock), "--log-level", "debug",
                           "--queue-notice", "0", "--queue-timeout", "0.5")
    procs = [gateway]
    try:
        gateway.start()  # "ready" means listening: it comes without NATS
        assert sock.exists()
        health = await _probe(gateway.unix)
        assert health.status == NOT_SERVING and url in health.metrics["not_serving_reason"]
        assert "retrying" in health.metrics["not_serving_reason"]
        async with await Client.connect(gateway.unix) as client:
            with pytest.raises(SmithError) as info:
                await client.handshake(["shell_exec"])
            assert info.value.details["reason"] == "nats_unavailable" and "NATS" in str(info.value)

        # Let several retries go by (every 0.5 s): one line said so, with the interval, not one per try.
        outage = {"nats unreachable, retrying", "nats connection failed, retrying"}
        assert wait_until(lambda: any(r.get("event") in outage for r in gateway.logs), 10), gateway.raw_stderr
        await asyncio.sleep(2)
        records = [r for r in gateway.logs if r.get("event") in outage]
        assert len(records) == 1, records
        assert float(records[0]["retry_interval"]) > 0 and "Connection refused" in records[0]["error"]
        assert not any(r.get("event") == "nats client error" for r in gateway.logs)

        nats.start()
        (tmp_path / "w").mkdir()
        (tmp_path / "root").mkdir()
        procs.append(SmithProcess(tmp_path / "w", "worker", "--nats", url, *FAST, "--root", str(tmp_path / "root")).start())
        wait_gateway(gateway, workers=1, timeout=30)
        async with await Client.connect(gateway.unix) as client:
            ready = await client.handshake(["shell_exec", "nats"], accept=["health"])
            assert pb.CAPABILITY_NATS in ready.capabilities and ready.service_info["smith_fast.worker"]
            assert (await _wait_health(client, SERVING)).status == SERVING
            assert _stdout([e async for e in client.shell_exec("echo in-service")]) == "in-service\n"
    finally:
        for proc in procs:
            if proc.proc is not None:
                proc.stop()
        nats.stop()
