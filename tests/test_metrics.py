"""Metrics: counters kept by the core, reported in-stream (MetricsEvent, ResourceUsageEvent, health)
and scraped over HTTP in the Prometheus formats, all from a real ``smith-fast serve`` process."""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.metrics import Histogram

from harness.server import ServerProcess, assert_clean_log, wait_until

EXPECTED_SAMPLES = {
    "smith_fast_frames_received_total",
    "smith_fast_frames_sent_total",
    "smith_fast_bytes_received_total",
    "smith_fast_bytes_sent_total",
    "smith_fast_commands_total",
    "smith_fast_errors_total",
    "smith_fast_hook_decisions_total",
    "smith_fast_sessions_total",
    "smith_fast_active_sessions",
    "smith_fast_running_processes",
    "smith_fast_network_connections",
    "smith_fast_request_duration_seconds_count",
    "smith_fast_request_duration_seconds_sum",
    "smith_fast_uptime_seconds",
}


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"metrics-{request.param}")
    (tmp / "hello.txt").write_text("hello world\n")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0", loop=request.param).start()
    assert srv.metrics_url.startswith("http://127.0.0.1:") and srv.metrics_url.endswith("/metrics")
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


def scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, parsed by prometheus_client's own parser."""
    _, text = scrape(url)
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(snapshot: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return snapshot[(name, frozenset(labels.items()))]


def rss_of(pid: int) -> int:
    return int(pathlib.Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---- Prometheus --------------------------------------------------------------------------------------


async def test_prometheus_counts_what_each_front_did(server: ServerProcess) -> None:
    before = samples(server.metrics_url)
    for address, protocol in ((server.unix, "v1"), (server.tcp, "v0"), (server.grpc, "v1")):
        async with await Client.connect(address, protocol=protocol) as client:
            await client.handshake()
            _ = [ev async for ev in client.shell_exec("echo hi")]
            assert (await client.call_tool("fs.read", {"path": "hello.txt"})).success
            with pytest.raises(SmithError):
                await client.call_tool("no.such.tool", {})
    after = samples(server.metrics_url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("smith_fast_commands_total", type="handshake") == 3
    assert delta("smith_fast_commands_total", type="shell_exec") == 3
    assert delta("smith_fast_commands_total", type="tool_call") == 6
    assert delta("smith_fast_errors_total", code="INVALID_TOOL") == 3
    for proto in ("v1", "v0", "grpc"):
        assert delta("smith_fast_sessions_total", protocol=proto) == 1
        assert delta("smith_fast_bytes_received_total", protocol=proto) > 0
        assert delta("smith_fast_bytes_sent_total", protocol=proto) > delta("smith_fast_bytes_received_total", protocol=proto) / 10
    # v1 socket: 4 frames in (handshake, exec, 2 tool calls) per client; gRPC: 4 messages; v0: 4 lines
    assert delta("smith_fast_frames_received_total", protocol="v1") == 4
    assert delta("smith_fast_frames_received_total", protocol="v0") == 4
    assert delta("smith_fast_frames_received_total", protocol="grpc") == 4
    # per request: PROCESSING, ToolResult or output..., terminal state: at least 3 events each
    assert delta("smith_fast_frames_sent_total", protocol="grpc") >= 3 + 3 * 3
    assert delta("smith_fast_request_duration_seconds_count", type="tool_call") == 6
    assert delta("smith_fast_request_duration_seconds_count", type="shell_exec") == 3
    assert delta("smith_fast_request_duration_seconds_sum", type="shell_exec") > 0
    inf = delta("smith_fast_request_duration_seconds_bucket", type="shell_exec", le="+Inf")
    assert inf == 3
    assert value(after, "smith_fast_uptime_seconds") > 0
    assert value(after, "smith_fast_running_processes") == 0
    # prometheus_client's process collector: what dashboards for any Python exporter expect
    assert abs(value(after, "process_resident_memory_bytes") - rss_of(server.pid)) < 16 << 20
    assert value(after, "process_open_fds") > 3
    assert value(after, "process_cpu_seconds_total") > 0
    info = [k for k in after if k[0] == "smith_fast_info"]
    assert len(info) == 1 and dict(info[0][1])["event_loop"] == server.argv[server.argv.index("--loop") + 1]


async def test_prometheus_gauges_follow_live_state(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as g, await Client.connect(server.unix) as u:
        await g.handshake()
        await u.handshake()
        agen = u.shell_exec("sleep 30")
        await agen.__anext__()  # PROCESSING: running
        snap = samples(server.metrics_url)
        assert value(snap, "smith_fast_running_processes") == 1
        assert value(snap, "smith_fast_active_sessions", protocol="grpc") >= 1
        assert value(snap, "smith_fast_active_sessions", protocol="v1") >= 1
        assert value(snap, "smith_fast_network_connections") >= 2
        await agen.aclose()
    assert wait_until(lambda: value(samples(server.metrics_url), "smith_fast_running_processes") == 0, 10)


def test_histogram_buckets_are_cumulative() -> None:
    hist = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        hist.observe(v)
    assert hist.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert (hist.count, hist.sum) == (4, pytest.approx(3.65))


def test_openmetrics_and_http_details(server: ServerProcess) -> None:
    ctype, text = scrape(server.metrics_url, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and text.endswith("# EOF\n")
    names = {f.name for f in parse_openmetrics(text)}
    assert {"smith_fast_commands", "smith_fast_request_duration_seconds", "process_open_fds"} <= names
    ctype, _ = scrape(server.metrics_url)
    assert ctype.startswith("text/plain; version=0.0.4")
    head = urllib.request.Request(server.metrics_url, method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as resp:
        assert resp.status == 200 and int(resp.headers["Content-Length"]) > 0 and resp.read() == b""
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.metrics_url.removesuffix("metrics") + "other", timeout=10)
    assert info.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(server.metrics_url, data=b"x", method="POST"), timeout=10)
    assert info.value.code == 405


# ---- in-stream reports ---------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["unix", "grpc"])
async def test_metrics_events_at_the_requested_interval(server: ServerProcess, via: str) -> None:
    address = server.unix if via == "unix" else server.grpc
    async with await Client.connect(address) as client:
        ready = await client.handshake([], accept=["metrics"], metrics_interval_ms=100)
        assert client.accepted == {"metrics"}
        assert ready.service_info["smith_fast.metrics_interval_ms"] == "100"
        start = time.monotonic()
        first = await asyncio.wait_for(client.resource_usage.get(), 5)
        await asyncio.sleep(1.0)
        elapsed = time.monotonic() - start
        reports = 1 + client.resource_usage.qsize()
        assert 0.4 * elapsed / 0.1 <= reports <= elapsed / 0.1 + 2
        metrics = []
        while not client.metrics.empty():
            metrics.append(client.metrics.get_nowait())
    assert first.memory_bytes > 1 << 20 and first.file_descriptors > 3 and first.network_connections >= 1
    assert 0 <= first.cpu_percent <= 100 * (os.cpu_count() or 1) + 1
    assert abs(first.timestamp - time.time() * 1000) < 60_000
    assert {m.metric_name for m in metrics} == EXPECTED_SAMPLES
    per_report = len([m for m in metrics if m.metric_name == "smith_fast_uptime_seconds"])
    assert per_report >= reports - 1
    commands = {m.labels["type"]: m.value for m in metrics if m.metric_name == "smith_fast_commands_total"}
    assert commands["handshake"] >= 1
    sent = [m for m in metrics if m.metric_name == "smith_fast_frames_sent_total" and m.labels["protocol"] == ("v1" if via == "unix" else "grpc")]
    assert [m.value for m in sent] == sorted(m.value for m in sent) and sent[-1].value > sent[0].value  # the reports themselves


async def test_resource_figures_are_sane(server: ServerProcess, tmp_path: pathlib.Path) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake(["shell_exec"], accept=["health"])

        async def figures() -> dict[str, str]:
            return dict((await client.health_check()).metrics)

        idle = await figures()
        assert abs(int(idle["memory_bytes"]) - rss_of(server.pid)) < 16 << 20
        assert abs(int(idle["file_descriptors"]) - fds_of(server.pid)) <= 2
        agens = [client.shell_exec(f"sleep 30 # {i}") for i in range(3)]
        for agen in agens:
            await agen.__anext__()
        busy = await figures()
        assert int(busy["running_processes"]) == 3
        assert int(busy["file_descriptors"]) >= int(idle["file_descriptors"]) + 3  # each child's pipes
        for agen in agens:
            await agen.aclose()
        async with await Client.connect(server.grpc) as other:
            await other.handshake([])
            assert int((await figures())["network_connections"]) >= 2
        # CPU %: a busy service shows it (measured since the previous health check)
        await figures()
        results = await asyncio.gather(*(client.call_tool("fs.read", {"path": "hello.txt"}) for _ in range(200)))
        assert all(r.success for r in results)
        assert float((await figures())["cpu_percent"]) > 1.0


async def test_v0_peers_never_get_the_additions(server: ServerProcess) -> None:
    async with await Client.connect(server.tcp, protocol="v0") as client:
        await client.handshake(["shell_exec"], accept=["metrics", "health", "batch_event"], metrics_interval_ms=50)
        assert client.accepted == frozenset()
        _ = [ev async for ev in client.shell_exec("seq 1 1000")]
        await asyncio.sleep(0.3)
        assert client.metrics.empty() and client.resource_usage.empty() and client.batches_received == 0


async def test_accept_is_echoed_and_unknown_items_warned(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        ready = await client.handshake([], accept=["health", "telepathy"], metrics_interval_ms=5)
        assert ready.service_info["smith_fast.accepted"] == "health"
        assert "smith_fast.metrics_interval_ms" not in ready.service_info  # metrics were not asked for
        ev = await asyncio.wait_for(client.events.get(), 5)
        assert ev.state_change.state == pb.SERVICE_STATE_READY  # the warning follows the handshake's answer
        log = await asyncio.wait_for(client.events.get(), 5)
        assert log.log.level == pb.LOG_LEVEL_WARN and "telepathy" in log.log.message
        # a repeated handshake changes what is accepted; the interval is clamped to 50 ms
        ready = await client.handshake([], accept=["metrics"], metrics_interval_ms=5)
        assert ready.service_info["smith_fast.metrics_interval_ms"] == "50"
        ready = await client.handshake([], client_info={"smith_fast.accept": "metrics", "smith_fast.metrics_interval_ms": "soon"})
        assert ready.service_info["smith_fast.metrics_interval_ms"] == "1000"
        warnings = []
        while not client.events.empty():
            ev = client.events.get_nowait()
            if ev.HasField("log"):
                warnings.append(ev.log.message)
        assert any("'soon' is not a number" in w for w in warnings)


async def test_batches_on_a_socket(server: ServerProcess) -> None:
    """Batching is not gRPC-only: a v1 socket peer that asks gets the same events in BatchEvents."""
    async with await Client.connect(server.unix) as plain, await Client.connect(server.unix) as batched:
        await plain.handshake()
        await batched.handshake(accept=["batch_event"])
        rid = str(uuid.uuid4())
        a = [ev async for ev in plain.shell_exec("seq 1 5000; echo done >&2", request_id=rid)]
        b = [ev async for ev in batched.shell_exec("seq 1 5000; echo done >&2", request_id=rid)]

    def shape(events: list[pb.Event]) -> tuple[str, str, list[int]]:
        out = "".join(e.shell_output.stdout for e in events if e.shell_output.HasField("stdout"))
        err = "".join(e.shell_output.stderr for e in events if e.shell_output.HasField("stderr"))
        return out, err, [e.state_change.state for e in events if e.HasField("state_change")]

    assert shape(a) == shape(b)
    assert plain.batches_received == 0 and batched.batches_received >= 1
