"""What the tests (tests/) and the benchmarks (bench/) both run: the real processes they start and
the fixtures they share. Part of the repository, not of the installed package.

Modules: ``server`` (``smith-fast serve``/``worker``/``gateway`` processes and the /proc readers
around them), ``nats_cluster`` (nats-server, and a cluster of workers behind a gateway),
``otlp_sink`` (an OTLP/HTTP trace receiver that keeps the spans it gets), ``twins`` (the wire-core twin
fixtures).
"""
