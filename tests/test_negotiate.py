"""``Negotiate`` against a real ``smith-fast serve --grpc`` under each ``--protocol`` pin (PROTOCOL.md, "Negotiate").

Every listener the answer points a v0 frontend at must answer a v0 handshake; with every socket
listener pinned to v1 there is none, and the call fails ``UNSUPPORTED_VERSION`` saying why.
``service_metadata`` carries what a Stream handshake's ``Ready.service_info`` carries, value for
value (plus the Negotiate-only keys), and endpoint lists follow PROTOCOL.md's format (a Unix path
with ``,`` and ``%`` in it survives the round trip).
"""

from __future__ import annotations

import pathlib
from urllib.parse import unquote

import grpc
import pytest
from grpc import aio

from smith_fast.client import Client, GrpcClient, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.pb import smith_pb2_grpc

from .server import ServerProcess, assert_clean_log
from harness.server import beside

PINS = ["auto", "v0", "v1"]
SPEAKS_V0 = {"auto": True, "v0": True, "v1": False}
NEGOTIATE_ONLY = {"available_capabilities", "smith_fast.acceptable", "rejected_capabilities", "jsonl_endpoints"}
ADDITIONS = {"smith_fast.accept": "health,metrics", "smith_fast.metrics_interval_ms": "500"}


@pytest.fixture(scope="module", params=PINS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"negotiate-{request.param}")
    odd = beside(tmp, "sockets") / "odd,name%2C.sock"  # the list's separator and escape character inside a path
    odd.parent.mkdir()  # (not in the root: the service refuses a root that holds its socket)
    srv = ServerProcess(tmp, "--unix", str(odd), "--grpc", "127.0.0.1:0", "--protocol", request.param).start()
    srv.odd = f"unix:{odd}"  # type: ignore[attr-defined]
    srv.pin = request.param  # type: ignore[attr-defined]
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


def endpoints(value: str) -> list[str]:
    """PROTOCOL.md, "Negotiate": comma-separated, each address percent-decoded."""
    return [unquote(item) for item in value.split(",")] if value else []


async def _negotiate(server: ServerProcess, versions: list[int], **kw) -> pb.NegotiateResponse:  # type: ignore[no-untyped-def]
    async with await Client.connect(server.grpc) as client:
        assert isinstance(client, GrpcClient)
        return await client.negotiate(versions, ["shell_exec"], **kw)


async def test_v0_frontend_is_pointed_only_at_listeners_that_speak_v0(server: ServerProcess) -> None:
    pin = server.pin  # type: ignore[attr-defined]
    if not SPEAKS_V0[pin]:
        async with aio.insecure_channel(server.grpc.removeprefix("grpc:")) as channel:
            stub = smith_pb2_grpc.SmithServiceStub(channel)
            with pytest.raises(aio.AioRpcError) as info:
                await stub.Negotiate(pb.NegotiateRequest(supported_versions=[0]))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert dict(info.value.trailing_metadata())["smith-error-code"] == "ERROR_CODE_UNSUPPORTED_VERSION"
        details = info.value.details() or ""
        assert "no listener of this service speaks version 0" in details and "--protocol v1" in details
        with pytest.raises(SmithError) as err:
            await _negotiate(server, [0])
        assert err.value.code == pb.ERROR_CODE_UNSUPPORTED_VERSION
        return
    resp = await _negotiate(server, [0])
    assert resp.selected_version == 0 and resp.fallback_to_jsonl
    listed = endpoints(resp.service_metadata["jsonl_endpoints"])
    assert listed == [server.unix, server.odd, server.tcp]  # type: ignore[attr-defined]
    for address in listed:  # every one of them answers a v0 frontend
        async with await Client.connect(address, protocol="v0") as client:
            ready = await client.handshake()
        assert ready.version == 0


@pytest.mark.parametrize("versions", [[1], [0, 1], [1, 0]])
async def test_a_v1_frontend_gets_v1_whatever_the_pin(server: ServerProcess, versions: list[int]) -> None:
    resp = await _negotiate(server, versions)
    assert resp.selected_version == 1 and not resp.fallback_to_jsonl
    assert "jsonl_endpoints" not in resp.service_metadata


async def test_service_metadata_says_what_ready_says(server: ServerProcess) -> None:
    resp = await _negotiate(server, [1], client_metadata=ADDITIONS)
    async with await Client.connect(server.grpc) as client:
        ready = await client.handshake(["shell_exec"], accept=["health", "metrics"], metrics_interval_ms=500)
    info = dict(ready.service_info)
    meta = dict(resp.service_metadata)
    assert info["smith_fast.accepted"] == "health,metrics" and info["smith_fast.metrics_interval_ms"] == "500"
    assert {k: meta[k] for k in info} == info
    assert set(meta) - set(info) <= NEGOTIATE_ONLY
    assert meta["available_capabilities"] == ",".join(sorted(meta["available_capabilities"].split(",")))
    # without additions asked for, the key is still there, empty, as in Ready
    plain = await _negotiate(server, [1])
    assert plain.service_metadata["smith_fast.accepted"] == ""
    assert "smith_fast.metrics_interval_ms" not in plain.service_metadata


async def test_v0_service_metadata_is_a_v0_sessions_service_info(server: ServerProcess) -> None:
    """A v0 ``Ready`` carries no ``service_info`` on the wire (JSONL has no such field), so the
    fallback answer says what a v0 session computes: the v1 keys without the Envelope additions."""
    if not SPEAKS_V0[server.pin]:  # type: ignore[attr-defined]
        with pytest.raises(SmithError):
            await _negotiate(server, [0])
        return
    v0 = dict((await _negotiate(server, [0], client_metadata=ADDITIONS)).service_metadata)
    v1 = dict((await _negotiate(server, [1], client_metadata=ADDITIONS)).service_metadata)
    assert v0["negotiated_version"] == "0" and v1["negotiated_version"] == "1"
    additions = {"smith_fast.accepted", "smith_fast.metrics_interval_ms"}
    assert set(v0) == (set(v1) - additions) | {"jsonl_endpoints"}
    assert {k: v for k, v in v0.items() if k not in ("negotiated_version", "jsonl_endpoints")} == {
        k: v for k, v in v1.items() if k not in additions | {"negotiated_version"}
    }


def test_endpoint_list_format() -> None:
    from smith_fast.service.core import endpoint_list

    addresses = ["unix:/run/a,b%c.sock", "tcp:127.0.0.1:7878", "tcp:[::1]:7878"]
    assert endpoint_list(addresses) == "unix:/run/a%2Cb%25c.sock,tcp:127.0.0.1:7878,tcp:[::1]:7878"
    assert endpoints(endpoint_list(addresses)) == addresses
    assert endpoint_list([]) == "" and endpoints("") == []



def test_a_grpc_only_service_says_it_has_no_v0_listener(tmp_path: pathlib.Path) -> None:
    from smith_fast.errors import ProtocolError
    from smith_fast.service.config import ServiceConfig
    from smith_fast.service.core import Endpoint, ServiceCore
    from smith_fast.service.grpc_front import negotiate

    core = ServiceCore(ServiceConfig(root=tmp_path))
    core.endpoints.append(Endpoint("grpc:127.0.0.1:50051", (1,)))
    with pytest.raises(ProtocolError, match=r"no listener of this service speaks version 0 \(it has no Unix or TCP listener\)") as info:
        negotiate(core, pb.NegotiateRequest(supported_versions=[0]))
    assert info.value.code == pb.ERROR_CODE_UNSUPPORTED_VERSION and info.value.details == {"supported_versions": "1"}
    assert negotiate(core, pb.NegotiateRequest(supported_versions=[0, 1])).selected_version == 1
