"""Scale-out over NATS JetStream: ``smith-fast gateway`` in front, ``smith-fast worker``s behind.

A gateway accepts frontends exactly as ``smith-fast serve`` does and forwards their requests into
a JetStream work queue; any number of workers run them and publish their events back. The design,
subjects, headers and delivery guarantees are in PROTOCOL.md, "Scale-out over NATS".

Modules: :mod:`.config` (names and limits), :mod:`.wire` (headers, message ids, the gateway's
per-request deduplication), :mod:`.jetstream` (connection, streams, pull feed, reliable
publisher), :mod:`.cli` (the two subcommands). The gateway: :mod:`.gateway` (a ServiceCore and
its Backend), :mod:`.bridge` (its NATS side), :mod:`.forwarding` (the request runner),
:mod:`.remote` (one forwarded request). A worker: :mod:`.worker`, :mod:`.publication` (a
command's events out), :mod:`.worker_sessions` (what a gateway session keeps on a worker),
:mod:`.hooks_bucket` (the hook sources all workers share).

Needs the ``nats-py`` package (``pip install smith-fast[nats]``); nothing here imports it until a
worker or a gateway starts, so the rest of smith-fast works without it.
"""

from .config import NatsConfig

__all__ = ["NatsConfig"]
