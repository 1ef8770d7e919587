"""The hooks bucket: the source of every session hook a worker loaded, for the other workers.

A gateway session's HookLoad runs on one worker; its later commands may run on any. The worker
that loaded a hook stores its ``HookLoadCommand`` in a JetStream key-value bucket under the hook's
key (:func:`~smith_fast.nats.wire.hook_key`), and a command carries the keys of its session's hooks
(``CommandMeta.hooks``): a worker that has not loaded one yet fetches it from here.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError
from nats.js import api
from nats.js.errors import KeyNotFoundError, NotFoundError

from ..hooks import HookLoadError
from ..pb import smith_pb2 as pb
from .config import NatsConfig

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

__all__ = ["HooksBucket"]


class HooksBucket:
    """The hooks bucket of a worker's NATS (``config.hooks_bucket``), once :meth:`open`.

    Args:
        config: NATS names and limits (the bucket's name, storage and replicas; how long NATS
            may stay away, ``submit_timeout``).
    """

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self.kv: KeyValue | None = None

    async def open(self, js: JetStreamContext) -> None:
        """Find the bucket, or create it."""
        config = self.config
        try:
            self.kv = await js.key_value(config.hooks_bucket)
        except (NotFoundError, Exception):  # BucketNotFoundError is not a NotFoundError subclass everywhere
            self.kv = await js.create_key_value(
                api.KeyValueConfig(
                    bucket=config.hooks_bucket,
                    description="smith-fast session hook sources (HookLoadCommand envelopes by hook key)",
                    history=1,
                    storage=api.StorageType(config.storage),
                    replicas=config.replicas,
                )
            )

    async def store(self, key: str, cmd: pb.HookLoadCommand) -> None:
        """Put a HookLoadCommand envelope under ``key`` in the hooks bucket (retrying while NATS is away)."""
        assert self.kv is not None
        env = pb.Envelope()
        env.command.hook_load.CopyFrom(cmd)
        env.command.hook_load.request_id = ""
        data = env.SerializeToString()
        deadline = time.monotonic() + self.config.submit_timeout
        while True:
            try:
                await self.kv.put(key, data)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def fetch(self, key: str) -> pb.HookLoadCommand:
        """The HookLoadCommand stored under ``key``.

        Raises:
            HookLoadError: it is not in the bucket (or NATS stayed away too long).
        """
        assert self.kv is not None
        deadline = time.monotonic() + self.config.submit_timeout
        while True:
            try:
                entry = await self.kv.get(key)
                break
            except KeyNotFoundError:
                raise HookLoadError(f"hook {key[:12]} is not in the hooks bucket {self.config.hooks_bucket}") from None
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise HookLoadError(f"hook {key[:12]} could not be fetched: {exc}") from None
                await asyncio.sleep(0.5)
        try:
            return pb.Envelope.FromString(entry.value or b"").command.hook_load
        except DecodeError as exc:
            raise HookLoadError(f"hook {key[:12]} in the bucket is not a HookLoadCommand envelope: {exc}") from None
