"""The relay's inline delivery (smith_fast.nats.delivery),
against a real nats-server, on both event loops."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import nats
import pytest

from harness.nats_cluster import NatsServer
from smith_fast.nats.config import NatsConfig
from smith_fast.nats.connect import close, connect
from smith_fast.nats.delivery import InlineDelivery
from smith_fast.nats.relay import Outbox, publish_now

from .conftest import Runner


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    srv = NatsServer(tmp_path_factory.mktemp("nats-delivery") / "store").start()
    yield srv
    srv.stop()


class Received:
    """What a handler was given, and whether it ran inline (in the transport's callback: no task)."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []
        self.inline = 0
        self.arrived = asyncio.Event()
        self.wanted = 0

    def __call__(self, subject: bytes, data: bytes) -> None:
        self.messages.append((subject, data))
        if asyncio.current_task() is None:
            self.inline += 1
        if len(self.messages) >= self.wanted:
            self.arrived.set()

    async def until(self, count: int, timeout: float = 20.0) -> None:
        self.wanted = count
        if len(self.messages) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), timeout)


def _writes() -> int | None:
    """Write calls this process made so far (``syscw`` of /proc/self/io), where that counts the
    NATS socket's: uvloop writes with write(2); the stdlib loop's send(2) is not counted (None)."""
    if type(asyncio.get_running_loop()).__module__.split(".")[0] != "uvloop":
        return None
    for line in pathlib.Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/self/io")


def _payload(i: int) -> bytes:
    # sizes from a few bytes to 300 KB: some span many socket reads, some share one
    size = (i * 7919) % 300_000 if i % 50 == 0 else (i * 31) % 2000
    return f"{i:08d}".encode() + bytes([i % 251]) * size


def test_messages_arrive_inline_whole_and_in_order(server: NatsServer, run: Runner[None]) -> None:
    async def main() -> None:
        sender = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            got = Received()
            await delivery.subscribe("t.>", got)
            others: list[bytes] = []

            async def other(msg: Any) -> None:  # another subscription keeps nats-py's own path
                others.append(msg.data)

            await nc.subscribe("o", cb=other)
            await nc.flush()
            await sender.flush()  # seen: publishes right after connecting were at times not delivered; after a PONG they are
            count = 1500
            for i in range(count):
                publish_now(sender, f"t.a.{i % 3}", _payload(i))
                if i % 100 == 0:
                    await sender.publish("o", b"%d" % i)
                    await nc.flush()  # a PING/PONG of this client between the messages
                if i % 10 == 0:
                    await asyncio.sleep(0)
            await sender.flush()
            await got.until(count)
            assert [int(d[:8]) for _, d in got.messages] == list(range(count))
            assert all(d == _payload(i) for i, (_, d) in enumerate(got.messages))
            assert [s for s, _ in got.messages[:3]] == [b"t.a.0", b"t.a.1", b"t.a.2"]
            assert got.inline > count // 2, f"only {got.inline} of {count} handled inline"
            want = [b"%d" % i for i in range(0, count, 100)]
            for _ in range(200):  # nats-py's own path (a queue, a task) may be behind the inline one under load
                if len(others) >= len(want):
                    break
                await asyncio.sleep(0.05)
            assert others == want
            assert nc.stats["in_msgs"] >= count
        finally:
            await close(sender)
            await close(nc)

    run(main())


def test_subscriptions_of_different_subjects_are_handled_in_the_streams_order(server: NatsServer, run: Runner[None]) -> None:
    """What a worker relies on to hear a background process's announcement (the presence subject)
    before the relayed Stdin that names it (its relay subject): each published by its own client,
    the second only once the first is on its way, and both subscribed through the inline path
    (a presence subscription on nats-py's own path, a queue and a task, was handled after)."""

    async def main() -> None:
        announcer = await nats.connect(server.url)
        relayer = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            order: list[bytes] = []
            both = asyncio.Event()

            def heard(subject: bytes, data: bytes) -> None:
                order.append(data)

            def relayed(subject: bytes, data: bytes) -> None:
                order.append(data)
                if len(order) >= 400:
                    both.set()

            await delivery.subscribe("presence", heard)
            await delivery.subscribe("relay.w1", relayed)
            await nc.flush()
            for c in (announcer, relayer):
                await c.flush()
            for i in range(200):
                publish_now(announcer, "presence", b"a%d" % i)
                await announcer.flush()  # the server has it before the relayed message is sent
                publish_now(relayer, "relay.w1", b"r%d" % i)
            await asyncio.wait_for(both.wait(), 20)
            assert sorted(order) == sorted(m for i in range(200) for m in (b"a%d" % i, b"r%d" % i))
            late = [i for i in range(200) if order.index(b"a%d" % i) > order.index(b"r%d" % i)]
            assert not late, f"relayed messages handled before the announcement sent ahead of them: {late[:10]}"
        finally:
            for c in (announcer, relayer, nc):
                await close(c)

    run(main())


def test_a_failing_handler_costs_one_message_not_the_connection(server: NatsServer, run: Runner[None]) -> None:
    async def main() -> None:
        sender = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            got = Received()

            def handler(subject: bytes, data: bytes) -> None:
                if data == b"bad":
                    raise RuntimeError("a fault of this message's handling")
                got(subject, data)

            await delivery.subscribe("f", handler)
            await nc.flush()
            await sender.flush()  # seen: publishes right after connecting were at times not delivered; after a PONG they are
            for data in (b"1", b"bad", b"2"):
                publish_now(sender, "f", data)
            await got.until(2)
            assert [d for _, d in got.messages] == [b"1", b"2"]
            assert nc.is_connected
        finally:
            await close(sender)
            await close(nc)

    run(main())


def test_inline_again_after_the_server_restarts(tmp_path: pathlib.Path, run: Runner[None]) -> None:
    srv = NatsServer(tmp_path / "store").start()

    async def main() -> None:
        config = NatsConfig(servers=(srv.url,), reconnect_wait=0.1)
        holder: list[InlineDelivery] = []
        reconnected = asyncio.Event()

        def on_reconnect() -> None:
            holder[0].reconnected()
            reconnected.set()

        nc = await connect(config, name="delivery-test", on_reconnect=on_reconnect)
        sender = await connect(config, name="delivery-sender")
        try:
            delivery = InlineDelivery(nc)
            holder.append(delivery)
            got = Received()
            await delivery.subscribe("r", got)
            await nc.flush()
            await sender.flush()  # seen: publishes right after connecting were at times not delivered; after a PONG they are
            publish_now(sender, "r", b"before")
            await got.until(1)
            srv.restart()
            await asyncio.wait_for(reconnected.wait(), 20)
            for _ in range(200):  # the sender reconnects on its own schedule
                if sender.is_connected:
                    break
                await asyncio.sleep(0.05)
            await nc.flush()
            await sender.flush()
            inline_before = got.inline
            for i in range(50):
                publish_now(sender, "r", b"after %d" % i)
            await sender.flush()
            await got.until(51)
            assert [d for _, d in got.messages] == [b"before", *(b"after %d" % i for i in range(50))]
            assert got.inline - inline_before > 25, "the new connection's messages are not handled inline"
        finally:
            await close(sender)
            await close(nc)

    try:
        run(main())
    finally:
        srv.stop()


def test_an_outbox_writes_an_iterations_messages_at_once_in_order(server: NatsServer, run: Runner[None]) -> None:
    async def main() -> None:
        sender = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            got = Received()
            await delivery.subscribe("b.>", got)
            await nc.flush()
            await sender.flush()
            outbox = Outbox(sender)
            # one loop step publishes 200 small messages: one write, after the step
            before = _writes()
            for i in range(200):
                assert outbox.publish(f"b.{i % 2}", b"%d" % i)
            assert _writes() == before, "a gathered message was written before the step ended"
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if before is not None:
                after = _writes()
                assert after is not None and 1 <= after - before <= 2, f"{after} - {before} writes for one step's 200 messages"
            await got.until(200)
            assert [d for _, d in got.messages] == [b"%d" % i for i in range(200)]
            # large ones are not held: past 64 KiB what is gathered is written at once, still in order
            big = [bytes([i]) * 50_000 for i in range(6)]
            for data in big:
                outbox.publish("b.big", data)
            await got.until(206)
            assert [d for _, d in got.messages[200:]] == big
        finally:
            await close(sender)
            await close(nc)

    run(main())


def test_a_held_message_goes_with_what_the_next_step_publishes(server: NatsServer, run: Runner[None]) -> None:
    """A worker's OPENED, held until the new session's Ready (written one loop step later) joins it."""

    async def main() -> None:
        sender = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            got = Received()
            await delivery.subscribe("h", got)
            await nc.flush()
            await sender.flush()
            outbox = Outbox(sender)
            loop = asyncio.get_running_loop()
            before = _writes()
            outbox.publish("h", b"opened", hold=True)
            loop.call_soon(outbox.publish, "h", b"ready")  # as the connection's flush of its first tick
            outbox.soon()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if before is not None:
                after = _writes()
                assert after is not None and after - before == 1, "the held message and the next step's were not one write"
            await got.until(2)
            assert [d for _, d in got.messages] == [b"opened", b"ready"]
        finally:
            await close(sender)
            await close(nc)

    run(main())


def test_an_outbox_goes_behind_what_nats_py_holds_unsent(server: NatsServer, run: Runner[None]) -> None:
    """Messages nats-py holds unsent (its own publish, or what it buffered while disconnected) when
    an outbox publishes are not overtaken: the outbox's go behind them."""

    async def main() -> None:
        sender = await nats.connect(server.url)
        nc = await nats.connect(server.url)
        try:
            delivery = InlineDelivery(nc)
            got = Received()
            await delivery.subscribe("q", got)
            await nc.flush()
            await sender.flush()
            outbox = Outbox(sender)
            expected = []
            for i in range(30):
                data = b"%d" % i
                expected.append(data)
                if i % 7 == 0:
                    await asyncio.sleep(0)  # what the outbox gathered is written
                    await sender.publish("q", data)  # into nats-py's pending buffer, written by its flusher later
                    assert sender._pending_data_size  # noqa: SLF001  (the case this test is about)
                else:
                    assert outbox.publish("q", data)
                if i % 5 == 0:
                    await asyncio.sleep(0)
            await got.until(30)
            assert [d for _, d in got.messages] == expected
        finally:
            await close(sender)
            await close(nc)

    run(main())
