"""The end-to-end benchmark report: ``smith-fast bench`` (``make bench``).

Real ``smith-fast serve`` processes, one per contender, driven by the same workloads over real
sockets and gRPC; medians of repeated runs with their spread, written as Markdown, JSON and PNG
charts. The pytest-benchmark suites under ``bench/`` stay the micro-level view.

Modules: ``wire`` (encoding commands, decoding events into small views), ``drivers`` (blocking
socket drivers), ``grpc_client`` (grpc.aio drivers), ``servers`` (the server processes),
``contenders``, ``workloads``, ``runner``, ``stats``, ``report`` (Markdown), ``charts``
(matplotlib, optional: ``pip install 'smith-fast[bench]'``), ``meta``, ``cli``.
"""
