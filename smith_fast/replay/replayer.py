"""Replaying a session log against a service and comparing what it answers with what was recorded.

The replayer re-sends the recorded client → service records byte for byte (so with the recorded
request ids), bad input included: envelopes as frames, v0 lines with their newline, bytes that were
not an Envelope as the frame they came in, a v0 line that was over the size limit as a line of as
many bytes at the same stream offset, a length prefix that broke the framing as those bytes. It
collects the events the service sends back, and compares the two sides as
:class:`~smith_fast.replay.diff.Transcript` s. (A handshake's token is not in the log; the token
given is put in its place. Stream offsets quoted in errors match when that token is as long as the
recorded one, which it is when it is the same token.)

Pacing. Before sending a command the replayer waits, in the replay, for whatever had already
happened in the recording before that command was sent: every request that had started
(``StateChange(PROCESSING)``) or ended (its terminal ``StateChange``) and every handshake that had
been answered (``Ready``). That keeps causally dependent commands in order (a handshake before the
requests it enables, ``fs.write`` before the ``fs.read`` that checks it, a duplicate id after the
request it duplicates had started) without serialising requests that overlapped in the recording. With
recorded pacing (the default) it also waits until the command's recorded time offset, counted from
the first command; with ``fast`` it sends as soon as those dependencies are met. Waiting for a
dependency gives up after ``timeout`` seconds (noted in the result) and the replay goes on.

After the last command the replayer waits for every request that ended in the recording to end, for
the connection to close if the recording ended with a ``Shutdown``, and then up to ``settle``
seconds for the rest of the events (until as many as were recorded have arrived, plus a short quiet
period to catch extra ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from ..client import AddressError, parse_address
from ..errors import FramingError, SmithFastError
from ..errors import ProtocolError
from ..framing import FrameDecoder, encode_frame
from ..jsonl import JsonlCodec, LineDecoder
from ..pb import smith_pb2 as pb
from .diff import Transcript, diff_transcripts
from .format import RECORD_IN, RECORD_IN_DISCARDED, RECORD_IN_LINE, RECORD_IN_MALFORMED, LogHeader
from .reader import Record, TornTail

__all__ = ["ReplayResult", "Replayer"]

_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
_HANDSHAKE = ("handshake", 0)
_QUIET = 0.05  # seconds without events after the expected count arrived: catches extra events
_MAX_UNIT = 1 << 26
_REDACTED_JSON = b'"<redacted>"'  # auth.REDACTED as a JSON string (replay does not import the service)
_TOKEN_KEY = "token"
_FILLER = b"x"  # what a discarded v0 line is re-sent as: its content was never kept

Marker = tuple[str, object]


def _markers(envelope: pb.Envelope) -> list[Marker]:
    """What an outbound envelope marks: a request's start or end, or a handshake's answer."""
    if envelope.WhichOneof("payload") == "event":
        events: Sequence[pb.Event] = [envelope.event]
    elif envelope.WhichOneof("payload") == "batch_event":
        events = envelope.batch_event.events
    else:
        return []
    out: list[Marker] = []
    for event in events:
        kind = event.WhichOneof("event_type")
        if kind == "state_change":
            sc = event.state_change
            if sc.state in _TERMINAL and sc.HasField("request_id") and sc.request_id:
                out.append(("end", sc.request_id))
            elif sc.state == pb.SERVICE_STATE_PROCESSING and sc.request_id:
                out.append(("start", sc.request_id))
        elif kind == "ready" or (
            kind == "error" and event.error.error_code == pb.ERROR_CODE_UNSUPPORTED_VERSION and not event.error.request_id
        ):
            out.append(_HANDSHAKE)
    return out


@dataclass
class _Step:
    offset_ns: int
    raw: bytes
    envelope: pb.Envelope | None  # None for a record that is not an Envelope (or a line that did not decode)
    needs: dict[Marker, int]
    kind: int = RECORD_IN


@dataclass
class ReplayResult:
    """What a replay found.

    Attributes:
        differences: the diff listing (see :func:`~smith_fast.replay.diff.diff_transcripts`); empty
            when the replay matched the recording.
        notes: things worth knowing that are not differences themselves (timeouts, a torn log, a
            connection closed early, records that were not envelopes).
        recorded, replayed: the two normalised transcripts.
        sent: commands sent.
    """

    differences: list[str]
    notes: list[str]
    recorded: Transcript
    replayed: Transcript
    sent: int = 0

    @property
    def identical(self) -> bool:
        """True when no stream differs."""
        return not self.differences


@dataclass
class _Plan:
    steps: list[_Step] = field(default_factory=list)
    final: Counter[Marker] = field(default_factory=Counter)
    expect_close: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _label(command: pb.Command) -> tuple[str | None, str]:
    kind = command.WhichOneof("command_type") or "?"
    inner = getattr(command, kind, None)
    rid = getattr(inner, "request_id", None) or None
    if kind == "shell_exec":
        line = command.shell_exec.command
        text = line if len(line) <= 60 else line[:57] + "..."
        return rid, f"shell_exec {text!r}"
    if kind == "tool_call":
        return rid, f"tool_call {command.tool_call.tool}"
    return rid, kind


class Replayer:
    """Replays one recorded session.

    Args:
        header: the log's header.
        records: its records (as :func:`~smith_fast.replay.reader.read_log` returns them).
        torn: the log's torn tail, if any (reported in the notes).
        fast: send each command as soon as its dependencies are met instead of at its recorded time.
        protocol: wire protocol to replay with (1 or 0); default: the recorded session's.
        timeout: seconds to wait for any one dependency (a request's end, the connection's close).
        settle: seconds to wait at the end for the remaining events.
        token: the shared secret of the service replayed against (``serve --token``): put into
            every handshake sent (a recorded handshake holds ``<redacted>`` in its place).
    """

    def __init__(
        self,
        header: LogHeader,
        records: Sequence[Record],
        *,
        torn: TornTail | None = None,
        fast: bool = False,
        protocol: int | None = None,
        timeout: float = 30.0,
        settle: float = 1.0,
        token: str | None = None,
    ) -> None:
        self.header = header
        self.token = token
        self.fast = fast
        self.protocol = header.protocol_version if protocol is None else protocol
        if self.protocol not in (0, 1):
            raise ValueError(f"protocol must be 0 or 1, not {self.protocol}")
        self.timeout = timeout
        self.settle = settle
        self._written = 0  # bytes sent in the current replay (where the next record starts)
        self._first_handshake = True  # not sent yet in the current replay
        self._plan = self._make_plan(records)
        if torn is not None:
            self._plan.notes.append(
                f"the log ends in a torn record at byte {torn.offset} ({torn.reason}); replayed the {len(records)} records before it"
            )
        rids = list(self._plan.order)
        self._recorded = Transcript(rids)
        for record in records:
            if not record.inbound:
                with contextlib.suppress(DecodeError):
                    self._recorded.add_envelope(record.parse())
        self._recorded.finish()
        self._rids = rids

    def _make_plan(self, records: Sequence[Record]) -> _Plan:
        plan = _Plan()
        seen: Counter[Marker] = Counter()
        pending: dict[Marker, int] = {}
        codec = JsonlCodec()
        for i, record in enumerate(records):
            env: pb.Envelope | None = None
            if record.direction == RECORD_IN_LINE or (record.direction == RECORD_IN_MALFORMED and self.header.protocol_version == 0):
                env = _line_envelope(codec, record.envelope)
            elif record.direction == RECORD_IN_DISCARDED:
                try:
                    record.discarded()
                except ValueError:
                    plan.notes.append(f"record {i} (byte {record.position}) is a damaged discarded record; skipped")
                    continue
                if self.header.protocol_version == 1:
                    plan.expect_close = True  # a v1 stream whose framing broke is closed
            elif record.direction != RECORD_IN_MALFORMED:
                try:
                    env = record.parse()
                except DecodeError:
                    plan.notes.append(f"record {i} (byte {record.position}) is not an Envelope; skipped")
                    continue
            if not record.inbound:
                assert env is not None
                for marker in _markers(env):
                    seen[marker] += 1
                    pending[marker] = seen[marker]
                continue
            plan.steps.append(_Step(record.offset_ns, record.envelope, env, pending, record.direction))
            pending = {}
            if env is None:
                continue
            kind = env.WhichOneof("payload")
            commands = [env.command] if kind == "command" else list(env.batch_command.commands) if kind == "batch_command" else []
            for command in commands:
                if command.WhichOneof("command_type") == "shutdown":
                    plan.expect_close = True
                rid, label = _label(command)
                if rid and rid not in plan.labels:
                    plan.labels[rid] = label
                    plan.order.append(rid)
        plan.final = seen
        return plan

    # ---- connecting ----------------------------------------------------------------------------

    async def against(self, address: str) -> ReplayResult:
        """Replay against a running service at ``unix:PATH``, ``tcp:HOST:PORT`` or ``HOST:PORT``.

        Raises:
            OSError: the connection cannot be made.
            AddressError: ``address`` is not one of those (a ``grpc:`` address, say).
        """
        kind, target = parse_address(address)
        if isinstance(target, tuple):
            reader, writer = await asyncio.open_connection(*target, limit=1 << 20)
        elif kind == "unix":
            reader, writer = await asyncio.open_unix_connection(target, limit=1 << 20)
        else:  # the frames go back as they were recorded, over a socket: gRPC has none to send them on
            raise AddressError(
                f"cannot replay against {address}: a replay re-sends the recorded frames over a socket; "
                "give the service's unix: or tcp: address"
            )
        return await self.run(reader, writer)

    async def spawn(self, *serve_args: str, env: Mapping[str, str] | None = None, python: str = sys.executable) -> ReplayResult:
        """Replay against a fresh ``smith-fast serve --stdio`` child (stopped afterwards).

        Args:
            serve_args: extra ``serve`` arguments (``--root``, limits ...).
            env: the child's environment (default: inherited).
            python: the interpreter to run it with.

        Raises:
            OSError: the child cannot be started.
        """
        proc = await asyncio.create_subprocess_exec(
            python, "-m", "smith_fast", "serve", "--stdio", "--log-level", "warning", *serve_args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None, limit=1 << 20,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            return await self.run(proc.stdout, proc.stdin)
        finally:
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    # ---- the replay ------------------------------------------------------------------------------

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ReplayResult:
        """Replay over an open stream pair; closes ``writer`` at the end."""
        plan = self._plan
        notes = list(plan.notes)
        replayed = Transcript(self._rids)
        seen: Counter[Marker] = Counter()
        changed = asyncio.Event()
        closed = asyncio.Event()
        codec = JsonlCodec() if self.protocol == 0 else None
        read_errors: list[str] = []

        def on_envelope(env: pb.Envelope) -> None:
            replayed.add_envelope(env)
            for marker in _markers(env):
                seen[marker] += 1

        async def read_loop() -> None:
            decoder: FrameDecoder | LineDecoder = FrameDecoder(_MAX_UNIT) if codec is None else LineDecoder(_MAX_UNIT)
            try:
                while True:
                    data = await reader.read(1 << 20)
                    if not data:
                        break
                    for unit in decoder.feed(data):
                        try:
                            if codec is None:
                                on_envelope(pb.Envelope.FromString(unit))
                            else:
                                env = pb.Envelope()
                                env.event.CopyFrom(codec.decode_event(unit))
                                on_envelope(env)
                        except (DecodeError, SmithFastError) as exc:
                            read_errors.append(f"the service sent something undecodable: {exc}")
                    changed.set()
            except (FramingError, ConnectionError, OSError) as exc:
                read_errors.append(f"reading from the service failed: {exc}")
            finally:
                closed.set()
                changed.set()

        async def until(pred: Callable[[], bool], what: str, timeout: float | None = None) -> bool:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (self.timeout if timeout is None else timeout)
            while not pred():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if what:
                        notes.append(f"gave up waiting for {what} after {self.timeout:g}s")
                    return False
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
            return True

        def describe(needs: Mapping[Marker, int]) -> str:
            parts = []
            for (kind, key), _n in needs.items():
                parts.append("the handshake answer" if kind == "handshake" else f"the {kind} of request {key}")
            return ", ".join(parts)

        def met(needs: Mapping[Marker, int]) -> bool:
            return all(seen[m] >= n for m, n in needs.items())

        reading = asyncio.get_running_loop().create_task(read_loop())
        loop = asyncio.get_running_loop()
        sent = 0
        self._written = 0  # bytes sent so far: where in the stream the next record starts
        self._first_handshake = True
        try:
            start = loop.time()
            base = plan.steps[0].offset_ns if plan.steps else 0
            for i, step in enumerate(plan.steps):
                if step.needs and not met(step.needs):
                    # Awaited here, before the loop moves on: the lambda's ``step`` is this one.
                    await until(lambda: met(step.needs) or closed.is_set(), describe(step.needs))
                if not self.fast:
                    delay = (step.offset_ns - base) / 1e9 - (loop.time() - start)
                    if delay > 0:
                        await until(closed.is_set, "", delay)
                if closed.is_set():
                    notes.append(f"the service closed the connection before command {i + 1} of {len(plan.steps)} was sent")
                    break
                tail = self._send(writer, codec, step, notes)
                sent += 1
                await writer.drain()
                if tail:  # the rest of a line that was still incomplete when the service gave up on it
                    await until(closed.is_set, "", _QUIET)
                    self._write(writer, tail)
                    await writer.drain()
            if not closed.is_set():
                await until(lambda: met(plan.final) or closed.is_set(), "the requests recorded as ended")
            if plan.expect_close:
                await until(closed.is_set, "the service to close the connection after Shutdown")
            expected = self._recorded.events
            await until(lambda: replayed.events >= expected or closed.is_set(), "", self.settle)
            while not closed.is_set():  # a quiet period, to catch events the recording did not have
                before = replayed.events
                await until(closed.is_set, "", _QUIET)
                if replayed.events == before:
                    break
        except (ConnectionError, OSError) as exc:
            notes.append(f"writing to the service failed: {exc}")
        finally:
            if not writer.is_closing():
                writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), 5)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        notes.extend(read_errors)
        replayed.finish()
        diff = diff_transcripts(self._recorded, replayed, order=plan.order, labels=plan.labels)
        return ReplayResult(diff, notes, self._recorded, replayed, sent)

    def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        self._written += len(data)
        writer.write(data)

    def _send(self, writer: asyncio.StreamWriter, codec: JsonlCodec | None, step: _Step, notes: list[str]) -> bytes:
        """Send one recorded inbound record; returns bytes to send a moment later (else b"")."""
        same = self.protocol == self.header.protocol_version
        if step.kind == RECORD_IN_DISCARDED:
            if not same:
                notes.append(f"bytes discarded by the recorded v{self.header.protocol_version} service have no v{self.protocol} form; not sent")
                return b""
            return self._send_discarded(writer, step)
        if step.kind == RECORD_IN_MALFORMED and same:  # as it arrived, in the unit it came in
            raw = step.raw if self.token is None else step.raw.replace(b"<redacted>", self.token.encode("utf-8", "surrogatepass"))
            self._write(writer, raw + b"\n" if codec is not None else encode_frame(raw))
            return b""
        if step.kind == RECORD_IN_LINE and same:
            first = self._first_handshake and step.envelope is not None and step.envelope.command.HasField("handshake")
            if first:
                self._first_handshake = False
            self._write(writer, self._with_token(step.raw, first) + b"\n")
            return b""
        env = step.envelope
        if env is None:
            notes.append(f"a recorded input the v{self.header.protocol_version} service could not decode has no v{self.protocol} form; not sent")
            return b""
        handshake = env.command.WhichOneof("command_type") == "handshake"
        first, self._first_handshake = self._first_handshake, self._first_handshake and not handshake
        # The token goes where the recording had one, and into the first handshake (the one that
        # authenticates) if that had none; other handshakes are sent as they were.
        give = self.token is not None and handshake and (first or _TOKEN_KEY in env.command.handshake.client_info)
        if codec is None:
            raw = step.raw
            if handshake and (not same or give):
                copy = pb.Envelope()
                copy.CopyFrom(env)
                env = copy
                if not same:
                    env.command.handshake.version = self.protocol
                if give and self.token is not None:  # give says there is one
                    env.command.handshake.client_info[_TOKEN_KEY] = self.token
                raw = env.SerializeToString()
            elif step.kind != RECORD_IN:
                raw = env.SerializeToString()
            self._write(writer, encode_frame(raw))
            return b""
        kind = env.WhichOneof("payload")
        if kind == "command" and give:
            line = json.loads(codec.encode_command(env.command))
            line["data"][_TOKEN_KEY] = self.token  # v0 has no client_info: a member of the Handshake's data
            self._write(writer, json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        elif kind == "command":
            self._write(writer, codec.encode_command(env.command))
        elif kind == "batch_command":  # v0 has no batches: send its commands one by one
            for command in env.batch_command.commands:
                self._write(writer, codec.encode_command(command))
        else:
            notes.append(f"a recorded {kind or 'empty'} envelope has no v0 form; not sent")
        return b""

    def _send_discarded(self, writer: asyncio.StreamWriter, step: _Step) -> bytes:
        what = Record(RECORD_IN_DISCARDED, step.offset_ns, step.raw, 0).discarded()
        if self.protocol == 1:  # the length prefix that broke the framing: the service closes after it
            self._write(writer, what.head)
            return b""
        # v0: a line of as many bytes, at the same stream offset (blank lines, which the service
        # skips, make up for blank lines and CRs of the recording that were not kept).
        gap = what.offset - self._written
        if gap > 0:
            self._write(writer, b"\n" * gap)
        self._write(writer, _FILLER * what.size + (b"\n" if what.complete else b""))
        return b"" if what.complete else b"\n"

    def _with_token(self, line: bytes, first: bool) -> bytes:
        """A recorded v0 line with the token given put in place of ``<redacted>`` (the first
        handshake, if it had none, gets it as a ``"token"`` member of its data)."""
        if self.token is None:
            return line
        token = json.dumps(self.token, ensure_ascii=False).encode()
        if _REDACTED_JSON in line:
            return line.replace(_REDACTED_JSON, token)
        if not first:
            return line
        try:
            obj = json.loads(line)
        except ValueError:
            return line
        if type(obj) is dict and obj.get("type") == "Handshake" and type(obj.get("data")) is dict:
            obj["data"][_TOKEN_KEY] = self.token
            return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        return line

    @property
    def commands(self) -> int:
        """How many client → service envelopes the replay will send."""
        return len(self._plan.steps)


def _line_envelope(codec: JsonlCodec, line: bytes) -> pb.Envelope | None:
    """The Envelope of the command a recorded v0 line holds (with an unknown capability, the rest of
    the handshake), for pacing, labels and replays over v1; None when the line does not decode."""
    try:
        command = codec.decode_command(line)
    except ProtocolError as exc:
        partial = getattr(exc, "command", None)  # the codec's decoded command, unknown capabilities left out
        if not isinstance(partial, pb.Command):
            return None
        command = partial
    env = pb.Envelope()
    env.command.CopyFrom(command)
    return env
