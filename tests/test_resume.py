"""Session resume end to end (PROTOCOL.md, "Resume"), against real ``smith-fast serve``
processes: the connection is cut mid-stream again and again through a TCP proxy and the peer resumes
each time with the last sequence it received; nothing is lost or duplicated. Then the refusals: the
window passed, a wrong or foreign token, a gap in what the service retained; and the bound on what a
parked session holds."""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc import aio
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast.pb import smith_pb2 as pb

from harness.cutting_proxy import CuttingProxy
from harness.server import ServerProcess, host_pids, pid_alive, wait_until

from .peers import kind

CUTS = 100
RESUME = {"smith_fast.accept": "resume"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], ServerProcess]]:
    """One service per event loop (the service's transports are the loop's), started when first used."""
    started: dict[str, ServerProcess] = {}

    def get(loop: str) -> ServerProcess:
        if loop not in started:
            started[loop] = ServerProcess(tmp_path_factory.mktemp(f"resume-{loop}"), "--kill-grace", "1s", "--grpc", "127.0.0.1:0",
                                          loop=loop).start()
        return started[loop]

    yield get
    for srv in started.values():
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A service with a short window and a small session buffer."""
    srv = ServerProcess(tmp_path_factory.mktemp("resume-short"), "--resume-window", "2.5s", "--max-session-buffer", "256k",
                        "--kill-grace", "0.5s").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def rid() -> str:
    return str(uuid.uuid4())


def shell(request_id: str, command: str) -> pb.Command:
    return pb.Command(shell_exec=pb.ShellExecCommand(request_id=request_id, command=command))


class Link:
    """One connection of an asyncio peer: varint-delimited Envelopes with protobuf's own codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: str) -> Link:
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    def send(self, command: pb.Command) -> None:
        data = pb.Envelope(timestamp=int(time.time() * 1000), command=command).SerializeToString()
        self.writer.write(_VarintBytes(len(data)) + data)

    async def recv(self) -> pb.Envelope:
        """The next envelope; ConnectionError once the connection is gone (a partial frame is lost with it)."""
        head = b""
        while True:
            byte = await self.reader.read(1)
            if not byte:
                raise ConnectionError("closed")
            head += byte
            if byte[0] < 0x80:
                break
        size, _ = _DecodeVarint(head, 0)
        try:
            return pb.Envelope.FromString(await self.reader.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("closed mid-frame") from exc

    def close(self) -> None:
        self.writer.transport.abort()

    async def aclose(self) -> None:
        self.close()


class GrpcLink:
    """One ``Stream`` call, on a channel of its own (a new channel reconnects at once, without the
    backoff an old one would wait out)."""

    def __init__(self, target: str) -> None:
        self.channel = aio.insecure_channel(target)
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.call: Any = self.channel.stream_stream("/smith.v1.SmithService/Stream")(self._requests())

    @classmethod
    async def open(cls, address: str) -> GrpcLink:
        return cls(address.removeprefix("tcp:"))

    async def _requests(self) -> Any:
        while (item := await self.queue.get()) is not None:
            yield item

    def send(self, command: pb.Command) -> None:
        self.queue.put_nowait(pb.Envelope(timestamp=int(time.time() * 1000), command=command).SerializeToString())

    async def recv(self) -> pb.Envelope:
        try:
            data = await self.call.read()
        except grpc.RpcError as exc:
            raise ConnectionError(str(exc)) from exc
        if data is aio.EOF:
            raise ConnectionError("the call ended")
        return pb.Envelope.FromString(data)

    async def aclose(self) -> None:
        self.call.cancel()
        await self.channel.close()


def handshake(**client_info: str) -> pb.Command:
    return pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC], client_info=client_info))


def resume(token: str, after: int) -> pb.Command:
    return pb.Command(handshake=pb.HandshakeCommand(version=1, resume_token=token, resume_after=after))


async def open_session(address: str, opener: Any = Link.open, **client_info: str) -> tuple[Any, str, int]:
    """A fresh session that asked for resume: its link, token and the last sequence received."""
    link = await opener(address)
    link.send(handshake(**{**RESUME, **client_info}))
    last = 0
    while True:
        env = await link.recv()
        last = env.sequence or last
        if kind(env) == "ready":
            token = env.event.ready.resume_token
        if kind(env) == "state_change" and env.event.state_change.state == pb.SERVICE_STATE_READY and not env.event.state_change.request_id:
            assert token, "no resume token in Ready"
            return link, token, last


class Request:
    """What a request's events said."""

    def __init__(self, command: str, lines: int) -> None:
        self.command = command
        self.expected = "".join(f"{i}\n" for i in range(1, lines + 1))
        self.stdout: list[str] = []
        self.processing = 0
        self.terminal: list[int] = []
        self.exit_code: int | None = None
        self.finished = 0
        self.link: Any = None  # the connection it was last sent on


class ResumingPeer:
    """A peer that resumes its session whenever its connection drops, and checks what it gets:
    every sequence once, in order; every request's output and terminal state."""

    def __init__(self, address: str, opener: Any = Link.open, **client_info: str) -> None:
        self.address = address
        self.opener = opener
        self.client_info = client_info
        self.batches = 0
        self.requests: dict[str, Request] = {}
        self.last = 0
        self.token = ""
        self.link: Any = None
        self.resumes = 0
        self.replayed = 0  # envelopes the service sent again (lost in flight at a cut)
        self.duplicates = 0  # commands sent again after a resume that the service had read after all
        self.received = asyncio.Event()  # something arrived since the last cut
        self.unexpected: list[str] = []

    async def start(self) -> None:
        self.link, self.token, self.last = await open_session(self.address, self.opener, **self.client_info)

    def run(self, request_id: str, request: Request, command: pb.Command | None = None) -> None:
        """Send ``request`` (as ``command`` when given, else a plain ShellExec of its command)."""
        self.requests[request_id] = request
        assert self.link is not None
        request.link = self.link
        self.link.send(command or shell(request_id, request.command))

    def open(self) -> list[str]:
        return [r for r, req in self.requests.items() if not req.terminal]

    async def _reconnect(self) -> int:
        """Resume until it works (a cut may land during the resume too); how many envelopes are replayed."""
        while True:
            await self.link.aclose()
            try:
                self.link = await self.opener(self.address)
                self.link.send(resume(self.token, self.last))
                env = await self.link.recv()
            except ConnectionError:
                continue
            assert kind(env) == "ready" and env.event.ready.resumed, env
            assert env.sequence == 0 and env.event.ready.resume_token == self.token
            self.resumes += 1
            replayed = int(env.event.ready.service_info["smith_fast.replayed"])
            self.replayed += replayed
            return replayed

    def _resend(self) -> None:
        """Commands the service never read (no PROCESSING, no terminal state after the replay, the
        events of its last envelope included) are sent again; one it had read is refused as a
        duplicate and changes nothing. Only those sent before this connection's resume handshake:
        one sent since follows the handshake on this connection and is read in turn (were it sent
        again and had ended by then, the copy would be a new request and run twice)."""
        assert self.link is not None
        for request_id, req in self.requests.items():
            if not req.processing and not req.terminal and req.link is not self.link:
                req.link = self.link
                self.link.send(shell(request_id, req.command))

    async def pump(self, done: Any) -> None:
        """Read (and resume) until ``done()`` says so."""
        replay = -1  # envelopes of the replay still to come
        while not done():
            assert self.link is not None
            try:
                env = await self.link.recv()
            except ConnectionError:
                replay = await self._reconnect()
                if replay == 0:
                    self._resend()
                continue
            self.received.set()
            if env.sequence:
                if env.sequence != self.last + 1:
                    self.unexpected.append(f"sequence {env.sequence} after {self.last}")
                self.last = env.sequence
            if env.HasField("batch_event"):
                self.batches += 1
                for event in env.batch_event.events:
                    self._event(event)
            else:
                self._event(env.event)
            # After the events of the last replayed envelope, not before: its PROCESSING says that
            # request was read (a copy sent on seeing only the sequence would run it again once
            # the request had ended before the copy arrived).
            if env.sequence and replay > 0:
                replay -= 1
                if replay == 0:
                    self._resend()

    def _event(self, event: pb.Event) -> None:
        event_kind = event.WhichOneof("event_type")
        if event_kind == "shell_output":
            out = event.shell_output
            req = self.requests[out.request_id]
            req.stdout.append(out.stdout)
            if out.finished:
                req.finished += 1
                req.exit_code = out.exit_code
        elif event_kind == "state_change":
            sc = event.state_change
            if sc.request_id:
                req = self.requests[sc.request_id]
                if sc.state == pb.SERVICE_STATE_PROCESSING:
                    req.processing += 1
                elif sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                    req.terminal.append(sc.state)
        elif event_kind == "error" and event.error.details.get("reason") == "duplicate_request":
            self.duplicates += 1
        else:
            self.unexpected.append(str(event).strip())


PACED = "python3 -u -c 'import time\nfor i in range(1, {n} + 1):\n print(i)\n time.sleep(0.002)'"


async def cut_often(
    proxy: CuttingProxy, peer: ResumingPeer, *, cuts: int, rng: random.Random, burst: int = 20000, paced: int = 300,
    pause: tuple[float, float] = (0.0, 0.03), in_flight: int = 3, timeout: float = 120,
) -> None:
    """Keep ``in_flight`` requests running (every third a burst of ``burst`` lines, the others
    ``paced`` lines) and cut the proxy a random ``pause`` after something arrived, until the peer
    resumed ``cuts`` times and its requests ended."""
    started = 0

    def launch() -> None:
        nonlocal started
        started += 1
        if started % 3 == 0:
            peer.run(rid(), Request(f"seq 1 {burst}", burst))  # a burst: much in flight at a cut
        else:
            peer.run(rid(), Request(PACED.format(n=paced), paced))

    for _ in range(in_flight):
        launch()

    async def cutter() -> None:
        while peer.resumes < cuts:
            await peer.received.wait()
            await asyncio.sleep(rng.uniform(*pause))
            peer.received.clear()
            proxy.cut(silent=rng.random() < 0.3)  # the service may not notice: the resume takes over

    async def keep_busy() -> None:
        while peer.resumes < cuts:
            await asyncio.sleep(0.05)
            while len(peer.open()) < in_flight and peer.resumes < cuts:
                try:
                    launch()
                except (ConnectionError, RuntimeError, AssertionError):
                    break

    cutting = asyncio.ensure_future(cutter())
    busy = asyncio.ensure_future(keep_busy())
    try:
        await asyncio.wait_for(peer.pump(lambda: peer.resumes >= cuts and not peer.open()), timeout)
    finally:
        cutting.cancel()
        busy.cancel()
        await asyncio.gather(cutting, busy, return_exceptions=True)


@pytest.mark.parametrize("accept", ["resume", "resume,batch_event"])
def test_resume_after_100_cuts_loses_and_duplicates_nothing(run, servers, request: pytest.FixtureRequest, accept: str) -> None:  # type: ignore[no-untyped-def]
    """The Done-when test: commands stream (paced and in bursts, several at once, new ones started
    while it goes on) while the proxy cuts the connection >= 100 times; the peer resumes each time.
    The service runs on the loop the peer does (``run``'s parameter); events one per envelope, or
    in BatchEvents (replayed as the batches they were)."""
    server = servers(request.node.callspec.params["run"])
    logged = len(server.logs)

    async def main() -> tuple[ResumingPeer, int]:
        async with CuttingProxy(server.tcp) as proxy:
            peer = ResumingPeer(proxy.address, **{"smith_fast.accept": accept})
            await peer.start()
            await cut_often(proxy, peer, cuts=CUTS, rng=random.Random(16))
            return peer, proxy.cuts

    peer, cuts = run(main())
    took_over = sum(1 for r in server.logs[logged:] if r.get("event") == "session resumed" and r.get("took_over"))
    print(f"{took_over} resumes took the session from a connection the service still had")
    assert took_over > 0
    print(f"{peer.resumes} resumes, {len(peer.requests)} requests, {peer.duplicates} duplicates refused, {peer.replayed} replayed, last sequence {peer.last}")
    assert peer.unexpected == []
    assert peer.resumes >= CUTS and cuts >= CUTS
    assert (peer.batches > 0) == ("batch_event" in accept)
    assert len(peer.requests) >= 3
    for request_id, req in peer.requests.items():
        assert req.terminal == [pb.SERVICE_STATE_READY], request_id
        assert req.processing == 1 and req.finished == 1 and req.exit_code == 0, request_id
        assert "".join(req.stdout) == req.expected, request_id


@pytest.mark.parametrize("accept", ["resume", "resume,batch_event"])
def test_the_peer_sends_again_only_what_the_service_never_read(run, servers, accept: str) -> None:  # type: ignore[no-untyped-def]
    """The interleaving the 100-cut test once lost under load (a request got PROCESSING and READY
    twice, in sequences 395/399 and 400/404): the last replayed envelope (395) carried the request's
    PROCESSING, the peer sent the request again on that envelope's sequence, before reading its
    events, and the copy arrived after the request had ended, so the service ran it as a new
    request (an id may be used again once its request ended). The service was right; the peer
    decides what to send again only after the events of the last replayed envelope, and never
    sends again what it sent after the resume handshake on the connection it reads.

    Driven exactly here: the first request waits for its stdin, so its PROCESSING is all the
    replay holds; the second is sent on the new connection while the replay is still to come.
    Both still run when a copy would arrive, so a copy would be refused (``duplicate_request``);
    had they ended, it would run them twice. Either way the checks below catch it."""
    server = servers("uvloop")

    async def main() -> ResumingPeer:
        peer = ResumingPeer(server.tcp, **{"smith_fast.accept": accept})
        await peer.start()
        waiting, sent_late = rid(), rid()
        command = "read line; seq 1 3"
        peer.run(waiting, Request(command, 3),
                 pb.Command(shell_exec=pb.ShellExecCommand(request_id=waiting, command=command, open_stdin=True)))
        # the service sends PROCESSING (alone: the request waits for its stdin); the connection
        # drops before the peer took it
        env = await asyncio.wait_for(peer.link.recv(), 30)
        events = env.batch_event.events if env.HasField("batch_event") else [env.event]
        assert [(e.state_change.state, e.state_change.request_id) for e in events] == [(pb.SERVICE_STATE_PROCESSING, waiting)], env
        assert env.sequence == peer.last + 1
        peer.link.close()

        reconnect = peer._reconnect

        async def reconnect_then_start_another() -> int:
            replay = await reconnect()
            assert replay == 1  # the PROCESSING the peer did not take
            peer.run(sent_late, Request("sleep 0.5; seq 1 2", 2))  # as keep_busy may, mid-replay
            return replay

        peer._reconnect = reconnect_then_start_another  # type: ignore[method-assign]  # the one resume this test makes

        async def feed_stdin_once_resumed() -> None:
            while not (peer.resumes and peer.requests[waiting].processing):
                peer.received.clear()
                await peer.received.wait()
            peer.link.send(pb.Command(stdin=pb.StdinCommand(request_id=waiting, data=b"go\n", eof=True)))

        feeding = asyncio.ensure_future(feed_stdin_once_resumed())
        try:
            await asyncio.wait_for(peer.pump(lambda: len(peer.requests) == 2 and not peer.open()), 60)
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            await peer.link.aclose()
        return peer

    peer = run(main())
    assert peer.resumes == 1 and peer.replayed == 1
    assert peer.unexpected == []
    assert peer.duplicates == 0, "the peer sent again a request the service had read"
    for request_id, req in peer.requests.items():
        assert req.terminal == [pb.SERVICE_STATE_READY], request_id
        assert req.processing == 1 and req.finished == 1 and req.exit_code == 0, request_id
        assert "".join(req.stdout) == req.expected, request_id


def _state(pid: int) -> str:
    """The process's state letter (``/proc/PID/stat``: R, S, T ...)."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_request_read_as_its_session_is_taken_over_runs_once_whatever_its_copy_finds(  # type: ignore[no-untyped-def]
    run, servers, request: pytest.FixtureRequest
) -> None:
    """The service's half: a request read on the old connection in the loop iteration that also
    reads the resume on the new one has not sent its PROCESSING when the replay is taken (it
    would come first in its task's first step), so the replay cannot show it was read and the
    peer sends it again. Had the request ended by the time that copy arrives, it would run as a
    new request: a second PROCESSING and READY. The service refuses that one copy as a duplicate.

    Driven exactly: the service is stopped (SIGSTOP) while the request goes out on the old
    connection and the resume on the new one, so that it reads both in one iteration; the copy
    is sent only once the request ended (a copy that long in flight)."""
    server = servers(request.node.callspec.params["run"])

    def connections() -> int:
        return sum(1 for r in server.logs if r.get("event") == "connection")

    async def main() -> tuple[int, list[tuple[int, str]], list[str]]:
        old, token, last = await open_session(server.tcp)
        before = connections()
        new = await Link.open(server.tcp)
        assert await asyncio.to_thread(wait_until, lambda: connections() > before, 10), "the new connection was not accepted"
        request_id, marker = rid(), rid()
        os.kill(server.pid, signal.SIGSTOP)
        # the signal is delivered, but a service busy on the other core may run on for a moment:
        # it must be stopped (state T) before the request goes out, or it may read it alone
        assert await asyncio.to_thread(wait_until, lambda: _state(server.pid) == "T", 10), "the service did not stop"
        try:
            old.send(shell(request_id, "echo once"))
            await old.writer.drain()
            new.send(resume(token, last))
            await new.writer.drain()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        ready = await asyncio.wait_for(new.recv(), 30)
        assert ready.event.ready.resumed, ready
        replayed = int(ready.event.ready.service_info["smith_fast.replayed"])
        # nothing of the request in the replay: the peer sends it again; here once it has ended
        seen: list[tuple[int, str]] = []  # (state, stdout) of the request's events, in order
        refusals: list[str] = []

        async def until_terminal(of: str) -> None:
            while True:
                env = await asyncio.wait_for(new.recv(), 30)
                for event in (env.batch_event.events if env.HasField("batch_event") else [env.event]):
                    which = event.WhichOneof("event_type")
                    if which == "state_change" and event.state_change.request_id == request_id:
                        seen.append((event.state_change.state, ""))
                    elif which == "shell_output" and event.shell_output.request_id == request_id:
                        seen.append((0, event.shell_output.stdout))
                    elif which == "error" and event.error.request_id == request_id:
                        refusals.append(event.error.details["reason"])
                    if which == "state_change" and event.state_change.request_id == of and event.state_change.state in (
                            pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                        return

        await until_terminal(request_id)
        new.send(shell(request_id, "echo once"))  # the copy
        new.send(shell(marker, "true"))  # read after it: once it ended, so did the copy's answer
        await until_terminal(marker)
        old.close()
        new.close()
        return replayed, seen, refusals

    replayed, seen, refusals = run(main())
    assert replayed == 0, "the request's PROCESSING was in the replay: the interleaving this test needs did not happen"
    assert [state for state, _ in seen if state] == [pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY], seen
    assert "".join(out for _, out in seen) == "once\n"
    assert refusals == ["duplicate_request"]


async def until_error(link: Link) -> pb.ErrorEvent:
    while True:
        env = await link.recv()
        if kind(env) == "error":
            return env.event.error


async def fresh_handshake_works(link: Link) -> None:
    """After a refused resume the connection is an unhandshaken one: a fresh handshake is answered."""
    link.send(handshake())
    while kind(env := await link.recv()) != "ready":
        pass
    assert not env.event.ready.resumed and not env.event.ready.resume_token  # it did not ask for resume


def test_after_the_window_the_requests_end_and_the_token_is_refused(run, short: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        link, token, last = await open_session(short.tcp)
        marker = f"sleep 60.{os.getpid()}"
        link.send(shell(rid(), f"echo $$; exec {marker}"))
        pid = 0
        while not pid:
            env = await link.recv()
            last = env.sequence or last
            if kind(env) == "shell_output" and env.event.shell_output.stdout:
                (pid,) = host_pids(short.pid, [int(env.event.shell_output.stdout)], marker)  # its pid namespace's
        link.close()
        await asyncio.sleep(0.5)
        assert pid_alive(pid), "the parked session's command was stopped within its window"
        assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 10), "the command outlived the window"
        again = await Link.open(short.tcp)
        again.send(resume(token, last))
        error = await until_error(again)
        assert error.error_code == pb.ERROR_CODE_PERMISSION_DENIED and error.details["reason"] == "resume_unknown", error
        assert "--resume-window" in error.message
        await fresh_handshake_works(again)
        again.close()

    run(main())


def test_a_wrong_token_another_services_token_or_an_ended_sessions_token_is_refused(run, short: ServerProcess, servers) -> None:  # type: ignore[no-untyped-def]
    other = servers("uvloop")

    async def main() -> None:
        link, token, last = await open_session(short.tcp)
        for address, presented in ((short.tcp, token[:-2] + "xx"), (other.tcp, token), (short.tcp, "")):
            attempt = await Link.open(address)
            attempt.send(resume(presented, last) if presented else handshake())
            if presented:
                error = await until_error(attempt)
                assert error.error_code == pb.ERROR_CODE_PERMISSION_DENIED and error.details["reason"] == "resume_unknown", (address, error)
            await fresh_handshake_works(attempt)
            attempt.close()
        # past what was sent: refused, and the session is still there to resume properly
        link.close()
        attempt = await Link.open(short.tcp)
        attempt.send(resume(token, last + 5))
        error = await until_error(attempt)
        assert error.details["reason"] == "resume_invalid", error
        attempt.send(resume(token, last))
        env = await attempt.recv()
        assert env.event.ready.resumed
        # a session that ended (Shutdown) cannot be resumed
        attempt.send(pb.Command(shutdown=pb.ShutdownCommand()))
        with pytest.raises(ConnectionError):
            while True:
                await attempt.recv()
        attempt = await Link.open(short.tcp)
        attempt.send(resume(token, last))
        error = await until_error(attempt)
        assert error.details["reason"] == "resume_unknown", error
        attempt.close()

    run(main())


def test_a_resume_that_needs_what_is_no_longer_retained_is_refused_not_answered_with_a_hole(run, short: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    """The ring keeps --max-session-buffer (256k here) of what was sent; a peer that lost more than
    that (it says so with an early resume_after) is told, and the session is left as it was."""

    async def main() -> None:
        link, token, early = await open_session(short.tcp)
        request = rid()
        link.send(shell(request, "seq 1 200000"))  # 1.3 MB
        last = early
        while not (kind(env := await link.recv()) == "state_change" and env.event.state_change.request_id == request
                   and env.event.state_change.state == pb.SERVICE_STATE_READY):
            last = env.sequence or last
        last = env.sequence
        link.close()
        again = await Link.open(short.tcp)
        again.send(resume(token, early))
        error = await until_error(again)
        assert error.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and error.details["reason"] == "resume_gap", error
        assert "--max-session-buffer" in error.message
        again.send(resume(token, last))  # what it did receive: resumed, nothing to replay
        env = await again.recv()
        assert env.event.ready.resumed and env.event.ready.service_info["smith_fast.replayed"] == "0"
        again.close()

    run(main())


def _rss(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_parked_session_holds_at_most_its_buffer_while_its_command_floods(run, short: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    """A command that writes as fast as it can while its peer is away: the service pauses it once
    the ring holds --max-session-buffer of unseen output, and the peer gets all of it after the resume."""

    async def main() -> None:
        link, token, last = await open_session(short.tcp)
        request = rid()
        # the peer has all of it when it drops; the flood starts while it is away
        link.send(shell(request, "echo away; sleep 0.3; yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 2000000000"))
        while not (kind(env := await link.recv()) == "shell_output" and env.event.shell_output.stdout == "away\n"):
            last = env.sequence or last
        last = env.sequence
        before = _rss(short.pid)
        link.close()
        peak = before
        for _ in range(20):  # the window is 2.5 s
            await asyncio.sleep(0.1)
            peak = max(peak, _rss(short.pid))
        print(f"parked: grew by {(peak - before) / 2**20:.1f} MiB")
        # 256k of ring, a chunk or two in flight: far below what the command could write meanwhile
        assert peak - before < 24 << 20, f"the service grew by {(peak - before) >> 20} MiB while the session was parked"
        again = await Link.open(short.tcp)
        again.send(resume(token, last))
        env = await again.recv()
        assert env.event.ready.resumed, env
        replayed = int(env.event.ready.service_info["smith_fast.replayed"])
        assert replayed > 0
        text = ""
        for _ in range(replayed + 20):  # the replay, then live output again
            env = await again.recv()
            assert env.sequence == last + 1, (env.sequence, last)
            last = env.sequence
            if kind(env) == "shell_output":
                text += env.event.shell_output.stdout
        assert text.startswith("0123456789abcdefghijklmnopqrstuvwxyz\n")
        assert set(text) <= set("0123456789abcdefghijklmnopqrstuvwxyz\n")
        again.send(pb.Command(cancel=pb.CancelCommand(request_id=request)))
        while not (kind(env := await again.recv()) == "state_change" and env.event.state_change.request_id == request
                   and env.event.state_change.state == pb.SERVICE_STATE_ERROR):
            pass
        again.close()

    run(main())


def test_the_sdk_resumes_transparently_under_an_async_for(run, servers) -> None:  # type: ignore[no-untyped-def]
    """``Client.connect(..., resume=True)``: cuts under ``async for chunk in proc`` and ``client.run``
    go unnoticed by the caller; the output is whole."""
    from smith_fast.client import Client

    server = servers("uvloop")

    async def main() -> tuple[bytes, bytes, int, int]:
        async with CuttingProxy(server.tcp) as proxy:
            streamed, burst, resumes = await under_cuts(proxy)
            return streamed, burst, resumes, proxy.cuts

    async def under_cuts(proxy: CuttingProxy) -> tuple[bytes, bytes, int]:
        client = await Client.connect(proxy.address, resume=True)
        await client.handshake()
        assert "resume" in client.accepted and client.resume_token

        async def cutter() -> None:
            while True:
                await asyncio.sleep(0.05)
                proxy.cut()

        cutting = asyncio.ensure_future(cutter())
        try:
            proc = await client.start(PACED.format(n=400))
            streamed = b"".join([chunk.data async for chunk in proc])
            assert await proc.wait() == 0
            burst = await client.run("seq 1 30000")
            assert burst.exit_code == 0
        finally:
            cutting.cancel()
            await asyncio.gather(cutting, return_exceptions=True)
            await client.close()
        return streamed, burst.stdout, client.resumes

    streamed, burst, resumes, cuts = run(main())
    print(f"{resumes} resumes over {cuts} cuts")
    assert streamed.decode() == Request("", 400).expected
    assert burst.decode() == Request("", 30000).expected
    assert resumes >= 5 and resumes <= cuts


def test_the_sdk_sends_again_only_what_the_service_never_read(run, servers) -> None:  # type: ignore[no-untyped-def]
    """The SDK's half of the interleaving above: the connection drops while the request's
    PROCESSING is on its way (the client is not reading), so that PROCESSING is the whole replay;
    the client must take it as read, not send the request again (the copy would be refused as a
    duplicate while it runs, or run it again had it ended)."""
    import select

    from smith_fast.client import Client

    server = servers("uvloop")
    logged = len(server.logs)

    async def main() -> tuple[str, bytes, int, int]:
        client = await Client.connect(server.tcp, resume=True)
        try:
            await client.handshake()
            transport = client._writer.transport  # the connection the test drops (the SDK's own)
            transport.pause_reading()
            proc = await client.start("read line; echo $line", stdin=True)
            fd = transport.get_extra_info("socket").fileno()
            while not select.select([fd], [], [], 0)[0]:  # the service sent something: its PROCESSING
                await asyncio.sleep(0.01)
            transport.abort()
            while not client.resumes:
                await asyncio.sleep(0.01)
            proc.write(b"went on\n")
            proc.close_stdin()
            out = b"".join([chunk.data async for chunk in proc])
            return proc.request_id, out, await proc.wait(), client.resumes
        finally:
            await client.close()

    request_id, out, code, resumes = run(main())
    assert resumes == 1 and out == b"went on\n" and code == 0
    refused = [r for r in server.logs[logged:] if r.get("event") == "protocol error" and request_id in str(r.get("error"))]
    assert refused == [], "the client sent again a request the service had read"


def test_a_unix_session_resumes_over_tcp_and_stdio_cannot_resume(run, short: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    """The token names the session, not the listener; a front without resume does not grant it."""
    from smith_fast.client import Client

    async def main() -> None:
        reader, writer = await asyncio.open_unix_connection(short.sock_path)
        link = Link(reader, writer)
        link.send(handshake(**RESUME))
        token, last = "", 0
        while not token:
            env = await link.recv()
            last = env.sequence or last
            token = env.event.ready.resume_token if kind(env) == "ready" else ""
        request = rid()
        link.send(shell(request, "sleep 0.3; echo done"))
        while not (kind(env := await link.recv()) == "state_change" and env.event.state_change.request_id == request):
            last = env.sequence or last
        last = env.sequence  # PROCESSING
        link.close()
        again = await Link.open(short.tcp)
        again.send(resume(token, last))
        env = await again.recv()
        assert env.event.ready.resumed
        out = ""
        while not (kind(env := await again.recv()) == "state_change" and env.event.state_change.request_id == request):
            assert env.sequence == last + 1
            last = env.sequence
            out += env.event.shell_output.stdout
        assert out == "done\n" and env.event.state_change.state == pb.SERVICE_STATE_READY
        again.close()

        stdio = await Client.spawn("--root", str(short.root))
        ready = await stdio.handshake(accept=["resume"])
        assert not ready.resume_token and "resume" not in stdio.accepted
        while (warning := await stdio.events.get()) is not None and not warning.HasField("log"):
            pass
        assert warning is not None and "resume is not available" in warning.log.message
        stdio.send(resume("anything", 0))
        while (refused := await stdio.events.get()) is not None and not refused.HasField("error"):
            pass
        assert refused is not None and refused.error.details["reason"] == "resume_unsupported"
        await stdio.close()

    run(main())


async def test_an_idle_grpc_session_survives_its_connection_dropping(servers) -> None:  # type: ignore[no-untyped-def]
    """A dropped connection ends a call's requests as a half-close would before grpc reports the
    call cancelled: an idle resumable session was then finished at once (a half-close with nothing
    running) and its resume refused ``resume_unknown``. Each of 40 cuts (no request running) must
    leave it resumable."""
    server = servers("uvloop")
    async with CuttingProxy("tcp:" + server.grpc.removeprefix("grpc:")) as proxy:
        link, token, last = await open_session(proxy.address, GrpcLink.open)
        try:
            for cut in range(40):
                await asyncio.sleep(0.01)
                assert proxy.cut() == 1
                while True:
                    await link.aclose()
                    try:
                        link = await GrpcLink.open(proxy.address)
                        link.send(resume(token, last))
                        env = await link.recv()
                    except ConnectionError:
                        continue
                    break
                assert kind(env) == "ready" and env.event.ready.resumed, (cut, env)
        finally:
            await link.aclose()


async def test_a_resumable_grpc_session_still_ends_at_a_half_close(servers) -> None:  # type: ignore[no-untyped-def]
    """A real half-close of a resumable session with nothing running ends the call with OK (after
    the grace a dropped connection's cancellation is given), and the session with it."""
    address = "tcp:" + servers("uvloop").grpc.removeprefix("grpc:")
    link, token, _ = await open_session(address, GrpcLink.open)
    try:
        link.queue.put_nowait(None)  # the request stream ends; the call still reads
        assert await asyncio.wait_for(link.call.code(), 10) == grpc.StatusCode.OK
        again = await GrpcLink.open(address)
        try:
            again.send(resume(token, 0))
            env = await again.recv()
            assert kind(env) == "error" and env.event.error.details["reason"] == "resume_unknown", env
        finally:
            await again.aclose()
    finally:
        await link.aclose()


async def test_a_grpc_stream_resumes_on_a_new_call(servers) -> None:  # type: ignore[no-untyped-def]
    """The same over gRPC: the resume handshake is the first message of a new ``Stream`` call."""
    server = servers("uvloop")
    async with CuttingProxy("tcp:" + server.grpc.removeprefix("grpc:")) as proxy:
        peer = ResumingPeer(proxy.address, GrpcLink.open)
        await peer.start()
        # Requests kept in flight until the last resume, as over a socket: the cuts follow what
        # arrives, and a session whose requests had all ended (on a slow run) sent nothing more to
        # cut after, and the test waited out its timeout.
        try:
            await cut_often(proxy, peer, cuts=20, rng=random.Random(6), pause=(0.0, 0.05))
        finally:
            await peer.link.aclose()
    print(f"gRPC: {peer.resumes} resumes, {peer.replayed} replayed, last sequence {peer.last}")
    assert peer.unexpected == []
    assert peer.resumes >= 20
    for request_id, req in peer.requests.items():
        assert req.terminal == [pb.SERVICE_STATE_READY], request_id
        assert req.processing == 1 and req.finished == 1 and req.exit_code == 0, request_id
        assert "".join(req.stdout) == req.expected, request_id
