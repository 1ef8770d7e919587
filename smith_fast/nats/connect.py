"""A gateway's or worker's NATS connection: one that never gives up reconnecting.

Core NATS only (no JetStream): sessions are placed on workers and relayed (smith_fast.nats.relay),
so nothing is stored in the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client as NATS

from ..logs import get_logger
from .config import NatsConfig

__all__ = ["close", "connect", "round_trip"]

log = get_logger("smith_fast.nats")


async def connect(
    config: NatsConfig,
    *,
    name: str,
    on_disconnect: Callable[[], None] | None = None,
    on_reconnect: Callable[[], None] | None = None,
    attempts: int = 0,
    options: dict[str, Any] | None = None,
) -> NATS:
    """Connect to the first reachable server of ``config.servers``.

    Once connected the client reconnects forever (every ``config.reconnect_wait`` seconds) and
    buffers up to 64 MiB of outgoing messages meanwhile.

    Args:
        config: the servers and the reconnection delay.
        name: the connection name the server shows.
        on_disconnect, on_reconnect: called when the connection drops and comes back.
        attempts: initial connection attempts before giving up; 0 tries forever.
        options: more keyword arguments of ``nats.connect`` (an identity's nkey, its inbox prefix).

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
                **(options or {}),
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


TASK_WAIT = 2.0
"""Seconds :func:`close` gives its tasks to end once cancelled."""


async def close(nc: NATS | None, tasks: Sequence[asyncio.Task[None]] = ()) -> None:
    """The end of a process's NATS connection: its ``tasks`` (heartbeats, announcements) cancelled,
    a bounded drain (subscriptions finish what they were handed, what was published is flushed),
    then the close; a server already gone makes neither wait nor raise."""
    # Every wait here is bounded: this is the way out of a stopping process. On 3.11 a cancellation
    # that lands as the future inside asyncio.wait_for completes is swallowed (nats-py's flush with a
    # timeout is one), and a task looping on it (announcing, every presence interval) runs on: it is
    # cancelled again, and after TASK_WAIT left to the loop's end rather than awaited for ever.
    pending = set(tasks)
    deadline = asyncio.get_running_loop().time() + TASK_WAIT
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=0.25)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a task that failed on the way out is no news
        if asyncio.get_running_loop().time() > deadline:
            break
    if pending:
        log.warning("tasks did not end when cancelled", extra={"fields": {"tasks": sorted(t.get_name() for t in pending)}})
    if nc is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.drain(), 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


async def round_trip(nc: NATS, timeout: float = 2.0) -> float:
    """Seconds for a PING/PONG with the server (``nc.rtt`` reads the loop's clock, which uvloop
    keeps in whole milliseconds: a loopback round trip would read 0)."""
    start = time.perf_counter()
    await nc.flush(timeout=max(1, round(timeout)))
    return time.perf_counter() - start
