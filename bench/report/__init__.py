"""The end-to-end benchmark report: ``python -m bench.report`` (``make bench``, ``make bench-quick``).

Real ``smith-fast serve`` processes, one per contender (started by ``harness.server``, the tests'
launcher), driven by the same workloads over real sockets and gRPC; medians of repeated runs with
their spread, written as Markdown, JSON and PNG charts. The pytest-benchmark suites beside it in
``bench/`` stay the micro-level view. It is part of the repository, not of the installed package.

Besides smith-fast's own configurations it runs a rival (a server written with the official MCP
Python SDK, against smith-fast's MCP front) and two references that are floors, not competitors:
a bare stdlib loop (``floor_server.py``) and commands spawned with no server at all.

Modules: ``wire`` (encoding commands, decoding events into small views), ``drivers`` (blocking
socket drivers), ``grpc_client`` (grpc.aio drivers), ``stdio`` (the JSON-RPC stdio driver and the
no-server reference), ``floor_server`` (the floor, run as a child), ``contenders``, ``workloads``,
``runner``, ``stats``, ``summary`` (the opening summary, generated from the figures), ``render``
(Markdown and JSON), ``charts`` (matplotlib, from requirements-dev.txt), ``meta``, ``nats`` (the
NATS scale-out section: ``bench/bench_nats.py`` run after the contenders), ``__main__`` (the
command line).
"""
