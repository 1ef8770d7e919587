"""The gateway composes a plain ServiceCore through the core's Backend seam (smith_fast/nats/gateway.py).

No NATS server here: these are the answers a gateway gives before it reached NATS, and the seam
itself (a backend missing a method fails when it is made, not on the first shutdown). The
forwarding over a real nats-server is tests/test_nats*.py's.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from smith_fast.nats.config import NatsConfig
from smith_fast.nats.forwarding import NatsRunner
from smith_fast.nats.gateway import Gateway
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.config import ServiceConfig
from smith_fast.service.core import Backend, ServiceCore
from smith_fast.service.session import Session
from smith_fast.service.sinks import V1Sink

pytestmark = pytest.mark.timeout(60)

NOWHERE = NatsConfig(servers=("nats://127.0.0.1:1",))  # never connected to in these tests


def _gateway(tmp_path: pathlib.Path, **config: object) -> Gateway:
    return Gateway(ServiceConfig(root=tmp_path, **config), NOWHERE)  # type: ignore[arg-type]


def test_the_gateway_composes_a_plain_core(tmp_path: pathlib.Path) -> None:
    gateway = _gateway(tmp_path)
    assert type(gateway.core) is ServiceCore
    assert not isinstance(gateway, ServiceCore)
    assert isinstance(gateway, Backend)
    assert not gateway.core.runs_locally  # the workers run the commands: no local sandbox check


def test_health_and_service_info_say_nats_is_not_reached(tmp_path: pathlib.Path) -> None:
    gateway = _gateway(tmp_path)
    reason = gateway.core.unavailable()
    assert reason is not None and "NATS is unreachable at nats://127.0.0.1:1" in reason
    info = gateway.core.service_info(1, [pb.CAPABILITY_SHELL_EXEC])
    assert info["smith_fast.gateway"] == gateway.bridge.gateway_id
    assert info["smith_fast.nats"] == "unreachable"
    assert info["smith_fast.workers"] == "0"
    assert info["smith_fast.not_serving_reason"] == reason
    assert info["service_name"] == "smith-fast" and info["granted_capabilities"] == "shell_exec"  # the core's own keys


def test_nats_is_offered_only_while_connected_and_only_if_permitted(tmp_path: pathlib.Path) -> None:
    core = _gateway(tmp_path).core
    assert pb.CAPABILITY_NATS not in core.capabilities
    core.offer(pb.CAPABILITY_NATS, True)
    assert pb.CAPABILITY_NATS in core.capabilities
    core.offer(pb.CAPABILITY_NATS, False)
    assert pb.CAPABILITY_NATS not in core.capabilities
    narrow = _gateway(tmp_path, capabilities=frozenset({"shell_exec"})).core
    narrow.offer(pb.CAPABILITY_NATS, True)
    assert pb.CAPABILITY_NATS not in narrow.capabilities  # --capabilities did not name it


def test_a_fixed_gateway_id_holds_resumes_until_the_take_over(tmp_path: pathlib.Path) -> None:
    plain = _gateway(tmp_path)
    assert not plain.core.parked.restoring and not plain.bridge.durable
    durable = Gateway(ServiceConfig(root=tmp_path), NOWHERE, gateway_id="gw-1")
    assert durable.bridge.durable and durable.bridge.gateway_id == "gw-1"
    assert durable.core.parked.restoring  # until the sessions of the process before are taken over


def test_sessions_get_a_forwarding_runner_and_shutdown_hands_nothing_over(tmp_path: pathlib.Path) -> None:
    async def main() -> tuple[object, bool, bool, bool]:
        gateway = _gateway(tmp_path)
        out: list[bytes] = []
        session = gateway.core.new_session(V1Sink(out.append, framed=False), close=lambda: None, peer="test", protocol="v1")
        assert isinstance(session, Session)
        runner = session.runner
        known = gateway.bridge.sessions.get(session.session_id) is runner
        carried = gateway.carried_on([session])  # not connected: a plain shutdown
        await gateway.core.shutdown()
        return runner, known, carried is None, gateway.core.closed.is_set()

    runner, known, plain, closed = asyncio.run(main())
    assert isinstance(runner, NatsRunner)
    assert known and plain and closed


def test_a_backend_missing_a_method_fails_when_made() -> None:
    class Half(Backend):
        def unavailable(self) -> str | None:
            return None

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]
