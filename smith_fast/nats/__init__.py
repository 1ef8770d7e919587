"""Scale-out over NATS: ``smith-fast gateway`` in front, ``smith-fast worker``s behind.

A gateway accepts frontends exactly as ``smith-fast serve`` does, places each session on one
worker and relays its bytes there over core NATS; the worker runs the session with ``serve``'s own
code. The design, subjects, roles and guarantees are in PROTOCOL.md, "Scale-out over NATS".

Modules: :mod:`.config` (servers, prefix, intervals), :mod:`.auth` (NATS identities and their
permissions), :mod:`.connect` (a connection that never gives up), :mod:`.relay` (subjects and
the relay message), :mod:`.presence` (the workers' announcements), :mod:`.placement` (where a
session goes), :mod:`.metrics`, :mod:`.cli` (the two subcommands). The gateway: :mod:`.gateway`
and :mod:`.gateway_front` (one relayed connection). A worker: :mod:`.worker` and
:mod:`.relay_transport` (a relayed connection as an asyncio transport), :mod:`.processes` (every
worker's background processes, for its sessions).

Needs the ``nats-py`` package (``pip install smith-fast[nats]``); nothing here imports it until a
worker or a gateway starts, so the rest of smith-fast works without it.
"""

from .config import NatsConfig

__all__ = ["NatsConfig"]
