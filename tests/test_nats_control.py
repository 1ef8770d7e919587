"""Process control through the NATS gateway (PROTOCOL.md, "Scale-out over NATS", "Process control"):
Cancel, stdin and resize reach the worker the session lives on, in order with the commands.

Real parts only: nats-server on a loopback port, ``smith-fast gateway`` and two ``worker``
processes (``harness/nats_cluster.py``), the SDK and raw commands over the gateway's Unix socket.
Processes are looked for among the workers' descendants in /proc. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from harness.nats_cluster import Cluster
from harness.server import SmithProcess, descendants, wait_until
from smith_fast.client import Client
from smith_fast.pb import smith_pb2 as pb

from .test_process_control import Raw, cancel, shell, started, stdin

FAST = ("--presence-interval", "0.3")
LIMITS = ("--kill-grace", "1s", "--max-stdin-buffer", "256k")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("natsctl"), workers=2, nats_args=FAST, worker_args=LIMITS, gateway_args=LIMITS).start()
    try:
        yield c
    finally:
        c.stop()


def rid() -> str:
    return str(uuid.uuid4())


def _cmdlines(proc: SmithProcess) -> dict[int, str]:
    out = {}
    assert proc.proc is not None
    for pid, _state in descendants(proc.proc.pid):
        try:
            out[pid] = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return out


def _running(cluster: Cluster, needle: str) -> list[int]:
    """Pids of the workers' descendants whose command line holds ``needle``."""
    return [pid for w in cluster.workers for pid, line in _cmdlines(w).items() if needle in line]


def _rss(proc: SmithProcess) -> int:
    assert proc.proc is not None
    for line in pathlib.Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def together(client: Client, *commands: pb.Command) -> None:
    """Commands in one BatchCommand: the gateway handles them in one go, as serve does a read
    holding them all (a Cancel or Stdin then comes before its request was forwarded)."""
    client.send_envelope(pb.Envelope(batch_command=pb.BatchCommand(commands=commands)))


def _reasons(raw: Raw) -> list[str]:
    return [e.details.get("reason", "") for e in raw.errors()]


# ---- cancel -------------------------------------------------------------------------------------


async def test_cancel_a_running_command_stops_its_process_and_ends_it_once(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        needle = f"sleep 30.{int(r[:6], 16)}"  # names this test's process among the workers'
        client.send(shell(r, f"echo up; {needle}"))
        await started(raw, b"up")
        assert wait_until(lambda: _running(cluster, needle), 20), "the sleep is not running on a worker"
        pids = _running(cluster, needle)
        client.send(cancel(r))
        await raw.end()
        await raw.quiet()
        assert raw.terminals() == [pb.SERVICE_STATE_ERROR], raw.events
        assert _reasons(raw).count("cancelled") == 1, raw.errors()
        cancelled = next(e for e in raw.errors() if e.details["reason"] == "cancelled")
        assert cancelled.message == f"request {r} cancelled by the peer" and cancelled.request_id == r
        assert "confirmed" not in cancelled.details  # the worker ended it, not the gateway's fallback
        finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
        assert len(finals) == 1 and finals[0].exit_code in (-15, -9), finals  # its final output came through
        assert pids and wait_until(lambda: not any(pathlib.Path(f"/proc/{pid}").exists() for pid in pids), 20), _running(cluster, needle)

        # cancelling twice is harmless; once it ended: a clear error, no state
        client.send(cancel(r))
        await raw.quiet()
        assert raw.terminals() == [pb.SERVICE_STATE_ERROR] and _reasons(raw).count("cancelled") == 1

        done = rid()
        finished = Raw(client, done)
        client.send(shell(done, "echo fine"))
        await finished.end()
        client.send(cancel(done))
        await finished.until(lambda e: e.WhichOneof("event_type") == "error")
        await finished.quiet()
        assert finished.terminals() == [pb.SERVICE_STATE_READY]
        assert _reasons(finished) == ["not_running"] and "already ended" in finished.errors()[0].message

        unknown = rid()
        stray = Raw(client, unknown)
        client.send(cancel(unknown))
        await stray.until(lambda e: e.WhichOneof("event_type") == "error")
        await stray.quiet()
        assert _reasons(stray) == ["unknown_request"] and stray.terminals() == []
        assert f"no request {unknown} is running" in stray.errors()[0].message


@pytest.mark.parametrize("kind", ["tool_call", "plan"])
async def test_cancel_any_request_on_a_worker(cluster: Cluster, kind: str) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        needle = f"sleep 300.{int(r[:6], 16)}"
        if kind == "tool_call":
            client.send(pb.Command(tool_call=pb.ToolCallCommand(request_id=r, tool="shell.run", args=b'{"command": "%s"}' % needle.encode())))
        else:
            client.send(pb.Command(plan=pb.PlanCommand(request_id=r, goal=needle, context={"execute": "true"})))
        assert wait_until(lambda: _running(cluster, needle), 20), "its process is not running on a worker"
        client.send(cancel(r))
        await raw.end()
        await raw.quiet()
        assert raw.terminals() == [pb.SERVICE_STATE_ERROR] and raw.errors()[-1].details["reason"] == "cancelled", raw.events
        assert "confirmed" not in raw.errors()[-1].details
        assert wait_until(lambda: not _running(cluster, needle), 20), "the cancelled request's process outlived it"


async def test_cancel_in_the_same_read_as_its_command_never_runs_it(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        together(client, shell(r, f"touch early-{r}"), cancel(r))
        await raw.end()
        await raw.quiet()
        assert raw.terminals() == [pb.SERVICE_STATE_ERROR] and _reasons(raw) == ["cancelled"], raw.events
        # the session goes on, and the cancelled command ran nowhere
        after = rid()
        later = Raw(client, after)
        client.send(shell(after, "echo after"))
        await later.end()
        assert later.stdout() == b"after\n"
        await asyncio.sleep(0.5)
        assert not (cluster.root / f"early-{r}").exists()


# ---- stdin and the terminal ------------------------------------------------------------------------


async def test_stdin_reaches_cat_through_the_gateway_in_order_with_eof(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        together(client, shell(r, "echo up; cat", open_stdin=True), stdin(r, b"one\n"))  # held by the gateway, then sent
        await started(raw, b"one\n")
        for i in range(50):
            client.send(stdin(r, b"%d\n" % i))
        client.send(stdin(r, eof=True))
        await raw.end()
        assert raw.stdout() == b"up\none\n" + b"".join(b"%d\n" % i for i in range(50))
        finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
        assert finals[0].exit_code == 0 and raw.terminals() == [pb.SERVICE_STATE_READY]
        assert raw.errors() == []

        # after eof the gateway refuses more, as serve does
        closed = rid()
        craw = Raw(client, closed)
        client.send(shell(closed, "cat; sleep 0.5", open_stdin=True))
        client.send(stdin(closed, b"x", eof=True))
        client.send(stdin(closed, b"late"))
        await craw.end()
        assert _reasons(craw) == ["stdin_closed"] and craw.stdout() == b"x"

        # the SDK's flow control works on what the workers report taken (stdin_written)
        result = await client.run("wc -c", input=b"y" * (1 << 20))
        assert result.stdout.split() == [b"1048576"] and result.exit_code == 0

        # stdin for a command without it: refused, the command unaffected
        plain = rid()
        praw = Raw(client, plain)
        client.send(shell(plain, "echo plain; sleep 0.3"))
        await started(praw, b"plain")
        client.send(stdin(plain, b"nope"))
        client.send(pb.Command(resize=pb.ResizeCommand(request_id=plain, rows=10, cols=10)))
        await praw.end()
        assert sorted(_reasons(praw)) == ["no_terminal", "stdin_closed"] and praw.terminals() == [pb.SERVICE_STATE_READY]

        # ... and in the same read as its ShellExec (before the gateway forwarded it)
        early = rid()
        eraw = Raw(client, early)
        together(client, shell(early, "echo early"), stdin(early, b"nope"), pb.Command(resize=pb.ResizeCommand(request_id=early, rows=10, cols=10)))
        await eraw.end()
        assert _reasons(eraw) == ["stdin_closed"], eraw.errors()  # one for what was held, as serve says
        assert "sent without open_stdin or pty" in eraw.errors()[0].message
        assert eraw.terminals() == [pb.SERVICE_STATE_READY] and eraw.stdout() == b"early\n"


async def test_pty_resize_reaches_the_terminal(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        script = "stty size; trap 'stty size' WINCH; echo ready; while :; do sleep 0.05; done"
        client.send(shell(r, script, pty=pb.PtyRequest(rows=33, cols=101)))
        await started(raw, b"ready")
        assert b"33 101\r\n" in raw.stdout()
        client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=40, cols=120)))
        await raw.until(lambda e: b"40 120" in raw.stdout())
        client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=70000, cols=1)))
        await raw.until(lambda e: e.WhichOneof("event_type") == "error")
        assert _reasons(raw) == ["invalid_field"]
        client.send(stdin(r, b"\x03"))  # Ctrl-C through the terminal
        await raw.end()
        finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
        assert finals[0].exit_code in (130, -2) and raw.terminals() == [pb.SERVICE_STATE_READY]


async def test_stdin_of_a_command_that_does_not_read_is_bounded(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        r = rid()
        raw = Raw(client, r)
        client.send(shell(r, "echo up; sleep 2; wc -c", open_stdin=True))
        await started(raw, b"up")
        before = {"gateway": _rss(cluster.gateway), **{f"w{i}": _rss(w) for i, w in enumerate(cluster.workers)}}
        piece = b"x" * (64 * 1024)
        for _ in range(64):  # 4 MiB at a child that reads nothing yet; --max-stdin-buffer is 256k
            client.send(stdin(r, piece))
        await raw.until(lambda e: e.WhichOneof("event_type") == "error")
        after = {"gateway": _rss(cluster.gateway), **{f"w{i}": _rss(w) for i, w in enumerate(cluster.workers)}}
        assert all(after[k] - before[k] < 16 << 20 for k in before), (before, after)
        client.send(stdin(r, eof=True))
        await raw.end()
        refused = [e for e in raw.errors() if e.details["reason"] == "stdin_full"]
        assert refused and refused[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "--max-stdin-buffer" in refused[0].message
        taken = int(raw.stdout().split()[-1])
        assert taken == (64 - len(refused)) * len(piece)  # what was accepted was written, nothing else
        acks = [e.shell_output.stdin_written for e in raw.of("shell_output") if e.shell_output.HasField("stdin_written")]
        assert acks and acks == sorted(acks) and acks[-1] == taken
        assert raw.terminals() == [pb.SERVICE_STATE_READY]


async def test_v0_stdin_through_the_gateway(cluster: Cluster) -> None:
    """v0 carries Stdin and Cancel; it gets no stdin_written (v0 has no such field)."""
    async with await Client.connect(cluster.unix, protocol="v0") as client:
        await client.handshake(["shell_exec"])
        result = await client.run("cat", input="über\n")
        assert result.stdout == "über\n".encode() and result.exit_code == 0
        piped = rid()
        praw = Raw(client, piped)
        client.send(shell(piped, "cat", open_stdin=True))
        client.send(stdin(piped, b"a" * 100_000, eof=True))
        await praw.end()
        assert praw.stdout() == b"a" * 100_000
        # the workers' stdin_written acknowledgements were not turned into empty v0 ShellOutputs
        assert all(e.shell_output.stdout or e.shell_output.finished for e in praw.of("shell_output")), praw.of("shell_output")
        r = rid()
        raw = Raw(client, r)
        client.send(shell(r, "echo up; sleep 30"))
        await started(raw, b"up")
        client.send(cancel(r))
        await raw.end()
        assert raw.terminals() == [pb.SERVICE_STATE_ERROR] and "cancelled" in raw.errors()[-1].message


# ---- a worker that cannot confirm ---------------------------------------------------------------
