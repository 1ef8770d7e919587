"""The JetStream plumbing shared by the gateway and the workers.

* :func:`connect`: a NATS connection that never gives up reconnecting.
* :func:`ensure_streams`: the command and event streams, created when missing.
* :class:`PullFeed`: messages of a durable pull consumer as soon as they are stored, with at most
  ``capacity`` in hand (one long-poll pull request outstanding at a time, renewed when it is used
  up, expires, or goes quiet: a request lost in a server restart is noticed by its missing
  heartbeats).
* :class:`Publisher`: JetStream publishes that do not wait, each acknowledged by the stream in the
  background and published again (same message id, so stored once) until it is, across
  reconnects and server restarts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from ..errors import PayloadTooLarge, PublishError
from ..logs import get_logger
from .config import NatsConfig

__all__ = [
    "close", "round_trip", "connect", "ensure_streams", "ensure_journal_stream", "ensure_worker_consumer", "ensure_gateway_consumer", "message_size",
    "PullFeed", "Publisher", "PublishError", "PayloadTooLarge",
]

log = get_logger("smith_fast.nats")

_PULL_API = "$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
_NS = 1_000_000_000


async def connect(
    config: NatsConfig,
    *,
    name: str,
    on_disconnect: Callable[[], None] | None = None,
    on_reconnect: Callable[[], None] | None = None,
    attempts: int = 0,
) -> NATS:
    """Connect to the first reachable server of ``config.servers``.

    Once connected the client reconnects forever (every ``config.reconnect_wait`` seconds) and
    buffers up to 64 MiB of outgoing messages meanwhile.

    Args:
        config: the servers and the reconnection delay.
        name: the connection name the server shows.
        on_disconnect, on_reconnect: called when the connection drops and comes back.
        attempts: initial connection attempts before giving up; 0 tries forever.

    Returns:
        The connected client.

    Raises:
        OSError: no server could be reached within ``attempts`` tries.
        ValueError: a TLS file of ``config`` cannot be used.
    """

    async def disconnected() -> None:
        log.warning("nats disconnected", extra={"fields": {"name": name}})
        if on_disconnect is not None:
            on_disconnect()

    reported: set[str] = set()  # why connecting failed, each reason said once per outage

    async def reconnected() -> None:
        reported.clear()
        log.info("nats reconnected", extra={"fields": {"name": name, "server": str(nc.connected_url.netloc if nc.connected_url else "")}})
        if on_reconnect is not None:
            on_reconnect()

    async def error(exc: Exception) -> None:
        # Said once per outage and reason, never per attempt: the client retries on its own every
        # reconnect_wait, and a line each time would bury everything else (a TLS refusal or a bad
        # certificate must still reach an operator at the default log level).
        text = repr(exc)
        if text in reported:
            return
        reported.add(text)
        if not nc.is_connected:
            log.warning("nats connection failed, retrying", extra={"fields": {"name": name, "error": text, "retry_interval": config.reconnect_wait}})
        else:
            log.info("nats client error", extra={"fields": {"name": name, "error": text}})

    tls = config.ssl_context()  # a bad file fails the start, before any attempt
    tried = 0
    while True:
        nc = NATS()
        try:
            await nc.connect(
                servers=list(config.servers),
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=config.reconnect_wait,  # type: ignore[arg-type]  # nats-py says int, but it is seconds for asyncio.sleep: a float works
                connect_timeout=2,
                ping_interval=5,
                max_outstanding_pings=3,
                pending_size=64 << 20,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
                tls=tls,
                **config.credentials(),
            )
            reported.clear()
            return nc
        except (OSError, nats.errors.Error, asyncio.TimeoutError) as exc:
            tried += 1
            if attempts and tried >= attempts:
                raise OSError(f"cannot reach NATS at {', '.join(config.servers)}: {str(exc) or type(exc).__name__}") from None
            wait = min(5.0, config.reconnect_wait * tried)
            if repr(exc) not in reported:  # once per reason, with when it is tried again
                reported.add(repr(exc))
                log.warning("nats unreachable, retrying",
                            extra={"fields": {"name": name, "servers": list(config.servers), "error": repr(exc), "retry_interval": wait}})
            await asyncio.sleep(wait)


async def close(nc: NATS | None, publisher: Publisher | None) -> None:
    """The end of a process's NATS connection: its publisher's queue first (what it holds is sent
    or failed), then a bounded drain (subscriptions finish what they were handed), then the close;
    a server already gone makes none of them wait or raise."""
    if publisher is not None:
        await publisher.close()
    if nc is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.drain(), 5)
        with contextlib.suppress(Exception):
            await nc.close()


async def round_trip(nc: NATS, timeout: float = 2.0) -> float:
    """Seconds for a PING/PONG with the server (``nc.rtt`` reads the loop's clock, which uvloop
    keeps in whole milliseconds: a loopback round trip would read 0)."""
    start = time.perf_counter()
    await nc.flush(timeout=max(1, round(timeout)))
    return time.perf_counter() - start


async def _ensure_stream(js: JetStreamContext, config: NatsConfig, name: str, tokens: str, description: str, **limits: Any) -> None:
    """Create stream ``name`` on ``<prefix>.<tokens>.>`` when missing, with the settings every
    stream shares (duplicate window, storage, replicas) and its own ``limits``."""
    cfg = api.StreamConfig(
        name=name, description=description, subjects=[f"{config.prefix}.{tokens}.>"],
        duplicate_window=config.duplicate_window, storage=api.StorageType(config.storage), num_replicas=config.replicas, **limits,
    )
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(cfg)
        log.info("stream created", extra={"fields": {"stream": cfg.name, "subjects": cfg.subjects}})
    except BadRequestError:
        await js.stream_info(name)  # created meanwhile by another process


async def ensure_streams(js: JetStreamContext, config: NatsConfig) -> None:
    """Create the command stream (work queue) and the event stream (interest) when missing."""
    await _ensure_stream(
        js, config, config.command_stream, "cmd", "smith-fast commands: gateway -> workers",
        retention=api.RetentionPolicy.WORK_QUEUE, max_msgs=config.max_commands, max_bytes=config.command_max_bytes,
        discard=api.DiscardPolicy.NEW,
    )
    await _ensure_stream(
        js, config, config.event_stream, "evt", "smith-fast events: workers -> gateways",
        retention=api.RetentionPolicy.INTEREST, max_bytes=config.event_max_bytes, max_age=config.event_max_age,
        discard=api.DiscardPolicy.OLD,
    )


async def ensure_journal_stream(js: JetStreamContext, config: NatsConfig) -> None:
    """The stream of a gateway's session journals (smith_fast.nats.journal): limits retention,
    the oldest messages dropped past its bounds."""
    await _ensure_stream(
        js, config, config.journal_stream, "out", "smith-fast gateway session journals",
        retention=api.RetentionPolicy.LIMITS, max_bytes=config.journal_max_bytes, max_age=config.journal_max_age,
        discard=api.DiscardPolicy.OLD,
    )


async def _ensure_consumer(js: JetStreamContext, stream: str, durable: str, cfg: api.ConsumerConfig) -> None:
    cfg = dataclasses.replace(cfg, durable_name=durable)
    try:
        await js.consumer_info(stream, durable)
        return
    except NotFoundError:
        pass
    try:
        await js.add_consumer(stream, cfg)
        log.info("consumer created", extra={"fields": {"stream": stream, "consumer": cfg.durable_name}})
    except BadRequestError:
        await js.consumer_info(stream, durable)  # created meanwhile by another process


async def ensure_worker_consumer(js: JetStreamContext, config: NatsConfig) -> None:
    """The durable pull consumer all workers share: explicit acks, ``ack_wait``, ``max_deliver``."""
    await _ensure_consumer(
        js,
        config.command_stream,
        config.worker_consumer,
        api.ConsumerConfig(
            description="smith-fast workers",
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=config.ack_wait,
            max_deliver=config.max_deliver,
            max_ack_pending=config.max_ack_pending,
            max_waiting=4096,
        ),
    )


async def ensure_gateway_consumer(js: JetStreamContext, config: NatsConfig, gateway: str) -> None:
    """One gateway's durable pull consumer of its own event subjects (ack-all; removed by the server
    after an hour without the gateway)."""
    await _ensure_consumer(
        js,
        config.event_stream,
        config.gateway_consumer(gateway),
        api.ConsumerConfig(
            description="smith-fast gateway events",
            filter_subject=config.gateway_filter(gateway),
            ack_policy=api.AckPolicy.ALL,
            ack_wait=30.0,
            max_ack_pending=1 << 20,
            inactive_threshold=3600.0,
        ),
    )


class PullFeed:
    """Messages of a durable pull consumer, handed to ``on_message`` as they arrive.

    Messages are asked for ahead, ``capacity`` beyond those in hand at most, in long-polling pull
    requests (each lingers on the server up to ``expires`` seconds and brings what is stored
    meanwhile, at once). A new request goes out whenever at least a quarter of the capacity is
    free and not yet asked for, so a busy owner never waits for a round trip per message. The
    owner calls :meth:`release` for each message it is done with (or ``auto_release``). What the
    server says about a request (408 expired, 409 ...) is taken into account; when nothing, not
    even a heartbeat, was heard for three heartbeats (a server restart, a reconnect), the
    requests are taken as lost and asked again.

    Args:
        nc: the connection.
        stream, consumer: the durable consumer to pull from.
        capacity: messages in hand at most.
        on_message: called with each message (status messages are handled here).
        expires: seconds a pull request lingers on the server.
        heartbeat: seconds between the server's idle heartbeats.
        auto_release: count a message as released as soon as ``on_message`` returned.
        on_gone: awaited when the server says the consumer was deleted (to create it again).
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        *,
        capacity: int,
        on_message: Callable[[Msg], None],
        expires: float = 10.0,
        heartbeat: float = 1.0,
        auto_release: bool = False,
        on_gone: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._nc = nc
        self._api = _PULL_API.format(stream=stream, consumer=consumer)
        self.capacity = capacity
        self._step = max(1, capacity // 4)
        self._on_message = on_message
        self._expires = expires
        self._heartbeat = heartbeat
        self._auto_release = auto_release
        self._on_gone = on_gone
        self.in_hand = 0  # units of work in hand: messages, or the commands they carry (hold())
        self._asked = 0  # messages the outstanding requests may still bring
        self._per_message = 1.0  # units a message brought lately (the largest, slowly forgotten)
        self._heard = 0.0
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._paused = False
        self.received = 0
        self.requests = 0

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._receive, pending_msgs_limit=1 << 20, pending_bytes_limit=1 << 30)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        self._ask()

    def stop(self) -> None:
        """Stop asking for messages. Those already asked for may still arrive, and are handed over
        (the owner should give them back: ``msg.nak()``), until :meth:`close`."""
        self._paused = True
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def close(self) -> None:
        """Stop, and stop receiving."""
        self.stop()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def hold(self, count: int) -> None:
        """The message just handed over holds ``count`` more units of work (a batch of commands):
        less room, and later requests ask for fewer messages, so that ``capacity`` counts units."""
        self.in_hand += count
        self._per_message = max(self._per_message, float(count + 1))

    def release(self, count: int = 1) -> None:
        """The owner is done with ``count`` messages: room for as many more."""
        self.in_hand -= count
        self._ask()

    def reset(self) -> None:
        """Forget the outstanding requests (after a reconnect) and ask again."""
        self._asked = 0
        self._ask()

    def _ask(self) -> None:
        per = self._per_message
        want = int((self.capacity - self.in_hand) / per) - self._asked if per > 1.0 else self.capacity - self.in_hand - self._asked
        step = max(1, int(self._step / per))
        if self._paused or want <= 0 or (want < step and self._asked > 0) or self._nc.is_closed:
            return
        if self._asked == 0:
            self._heard = time.monotonic()
        self._asked += want
        self.requests += 1
        request = {"batch": want, "expires": int(self._expires * _NS), "idle_heartbeat": int(self._heartbeat * _NS)}
        asyncio.get_running_loop().create_task(self._send(json.dumps(request).encode(), want))

    async def _send(self, request: bytes, want: int) -> None:
        try:
            await self._nc.publish(self._api, request, reply=self._inbox)
        except Exception as exc:  # closed, or the reconnect buffer is full: the watchdog asks again
            log.info("pull request not sent", extra={"fields": {"error": repr(exc)}})
            self._asked = max(0, self._asked - want)

    async def _receive(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is not None and not msg.data and not msg.reply:
            if status == "100":  # idle heartbeat
                return
            # 404/408: a request ended (no messages, expired); 409: consumer deleted, leadership
            # changed, limits ... The header says how many of its messages it will not bring.
            pending = headers.get("Nats-Pending-Messages")
            self._asked = max(0, self._asked - int(pending)) if pending is not None else 0
            description = str(headers.get("Description", ""))
            if status == "409" and "Deleted" in description and self._on_gone is not None:
                await self._on_gone()
            if status not in ("404", "408"):
                log.info("pull request ended", extra={"fields": {"status": status, "description": description}})
                await asyncio.sleep(0.1)
            self._ask()
            return
        self.received += 1
        self.in_hand += 1
        if self._per_message > 1.0:  # batches shrank? ask for more messages again, slowly
            self._per_message = max(1.0, self._per_message * 0.97)
        if self._asked > 0:
            self._asked -= 1
        try:
            self._on_message(msg)
        finally:
            if self._auto_release:
                self.in_hand -= 1
            self._ask()

    async def _watch(self) -> None:
        quiet = 3 * self._heartbeat
        while True:
            await asyncio.sleep(self._heartbeat)
            if self._asked > 0 and time.monotonic() - self._heard > quiet:
                self._asked = 0  # lost (server restart, reconnect): the server no longer has them
            self._ask()


def message_size(payload: bytes, headers: Mapping[str, str] | None) -> int:
    """What a message counts against the server's ``max_payload``: its payload and its header block
    as nats-py writes it (``NATS/1.0``, ``Key: value`` lines, a blank line). nats-py checks the
    payload alone; the server refuses ``HPUB`` on the two together."""
    size = len(payload)
    if headers:
        size += 12  # "NATS/1.0\r\n" and the closing "\r\n"
        for key, value in headers.items():
            size += len(key.strip().encode()) + len(value.strip().encode()) + 4  # ": " and "\r\n"
    return size


class _Pending:
    __slots__ = ("subject", "payload", "headers", "future", "deadline", "sent", "token", "attempts")

    def __init__(self, subject: str, payload: bytes, headers: dict[str, str], future: asyncio.Future[int], deadline: float | None) -> None:
        self.subject = subject
        self.payload = payload
        self.headers = headers
        self.future = future
        self.deadline = deadline
        self.sent = 0.0
        self.token = 0
        self.attempts = 0


class Publisher:
    """Publishes to JetStream in the background, in order, until each message is stored.

    :meth:`publish` returns at once with a future of the message's stream sequence number.
    Messages go out in the order they were given; the stream's acknowledgements come back on one
    wildcard inbox. A message not acknowledged within ``timeout`` seconds, or answered "no
    responders" / a 5xx error (JetStream restarting), is published again under the same
    ``Nats-Msg-Id`` (the stream stores it once); a 4xx error (stream full) fails it at once; a
    message with a ``deadline`` that passes fails with :class:`PublishError`.

    ``backlog`` counts messages given and not yet acknowledged; ``on_high``/``on_low`` are called
    when it crosses ``high_water`` upwards and ``low_water`` downwards (the worker pauses and
    resumes its commands' pipes there).

    Args:
        nc: the connection.
        timeout: seconds to wait for one acknowledgement.
    """

    def __init__(
        self,
        nc: NATS,
        *,
        timeout: float = 5.0,
        high_water: int = 8192,
        low_water: int = 2048,
        on_high: Callable[[], None] | None = None,
        on_low: Callable[[], None] | None = None,
    ) -> None:
        self._nc = nc
        self._timeout = timeout
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wake = asyncio.Event()
        self._inflight: dict[int, _Pending] = {}
        self._next_token = 0
        self._prefix = nc.new_inbox() + "."
        self._sub: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.backlog = 0
        self.high_water = high_water
        self.low_water = low_water
        self._on_high = on_high
        self._on_low = on_low
        self._high = False
        self.republished = 0
        self.published = 0

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._acked)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_loop()), loop.create_task(self._sweep())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for item in [*self._queue, *self._inflight.values()]:
            if not item.future.done():
                item.future.set_exception(PublishError("the publisher was closed"))

    @property
    def max_payload(self) -> int:
        """The largest message (payload plus headers) the server takes: its INFO ``max_payload``."""
        return self._nc.max_payload

    def publish(self, subject: str, payload: bytes, headers: dict[str, str], *, deadline: float | None = None) -> asyncio.Future[int]:
        """Queue one message; returns a future of its stream sequence number.

        Args:
            subject: where to publish.
            payload: the body.
            headers: its headers; ``Nats-Msg-Id`` should be set, so a republish is stored once.
            deadline: ``time.monotonic()`` after which it fails instead of being published again.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        size, limit = message_size(payload, headers), self._nc.max_payload
        if size > limit:
            future.set_exception(PayloadTooLarge(size, limit))
            return future
        self._queue.append(_Pending(subject, payload, headers, future, deadline))
        self.backlog += 1
        if not self._high and self.backlog >= self.high_water:
            self._high = True
            if self._on_high is not None:
                self._on_high()
        self._wake.set()
        return future

    def _settled(self) -> None:
        self.backlog -= 1
        if self._high and self.backlog <= self.low_water:
            self._high = False
            if self._on_low is not None:
                self._on_low()

    async def _send_loop(self) -> None:
        nc, queue, inflight = self._nc, self._queue, self._inflight
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = queue.popleft()
            if item.future.done():  # failed meanwhile (closed, deadline)
                self._settled()
                continue
            size, limit = message_size(item.payload, item.headers), nc.max_payload
            if size > limit:  # reconnected to a server with a smaller max_payload: it never fits
                item.future.set_exception(PayloadTooLarge(size, limit))
                self._settled()
                continue
            self._next_token += 1
            token = self._next_token
            item.token = token
            item.sent = time.monotonic()
            item.attempts += 1
            inflight[token] = item
            try:
                await nc.publish(item.subject, item.payload, reply=f"{self._prefix}{token}", headers=item.headers)
                self.published += 1
            except nats.errors.MaxPayloadError:  # cannot succeed: fail it, do not hold the queue
                inflight.pop(token, None)
                if not item.future.done():
                    item.future.set_exception(PayloadTooLarge(message_size(item.payload, item.headers), nc.max_payload))
                self._settled()
            except Exception as exc:  # the reconnect buffer is full, or the client is closed
                inflight.pop(token, None)
                log.info("publish failed, retrying", extra={"fields": {"subject": item.subject, "error": repr(exc)}})
                queue.appendleft(item)
                await asyncio.sleep(0.2)

    def _retry(self, item: _Pending, why: str) -> None:
        if item.deadline is not None and time.monotonic() > item.deadline:
            if not item.future.done():
                item.future.set_exception(PublishError(f"not stored in time: {why}"))
            self._settled()
            return
        self.republished += 1
        self._queue.append(item)
        self._wake.set()

    async def _acked(self, msg: Msg) -> None:
        try:
            token = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        item = self._inflight.pop(token, None)
        if item is None:  # answered after we gave up on it and published it again
            return
        status = msg.headers.get("Status") if msg.headers else None
        if status == "503":  # no responders: JetStream is not (yet) there
            self._retry(item, "no JetStream responders")
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            self._retry(item, "unreadable acknowledgement")
            return
        error = answer.get("error")
        if error is not None:
            status_code = int(error.get("code", 0))
            if status_code >= 500:
                self._retry(item, str(error.get("description", "")))
                return
            if not item.future.done():
                item.future.set_exception(PublishError(str(error.get("description", "refused")), int(error.get("err_code", 0)), status_code))
            self._settled()
            return
        if not item.future.done():
            item.future.set_result(int(answer.get("seq", 0)))
        self._settled()

    async def _sweep(self) -> None:
        period = min(0.25, self._timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            late = [t for t, item in self._inflight.items() if now - item.sent > self._timeout]
            for token in late:
                item = self._inflight.pop(token)
                self._retry(item, f"no acknowledgement within {self._timeout:g} s")
            for item in list(self._queue):  # deadlines of what is waiting to be (re)sent
                if item.deadline is not None and now > item.deadline and not item.future.done():
                    item.future.set_exception(PublishError("not stored in time: NATS unreachable"))
