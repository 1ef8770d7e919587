"""The end-to-end benchmark report: ``python -m bench.report`` (``make bench``, ``make bench-quick``).

Real ``smith-fast serve`` processes, one per contender (started by ``harness.server``, the tests'
launcher), driven by the same workloads over real sockets and gRPC; medians of repeated runs with
their spread, written as Markdown, JSON and PNG charts. The pytest-benchmark suites beside it in
``bench/`` stay the micro-level view. It is part of the repository, not of the installed package.

Modules: ``wire`` (encoding commands, decoding events into small views), ``drivers`` (blocking
socket drivers), ``grpc_client`` (grpc.aio drivers), ``contenders``, ``workloads``, ``runner``,
``stats``, ``render`` (Markdown and JSON), ``charts`` (matplotlib, from requirements-dev.txt),
``meta``, ``__main__`` (the command line).
"""
