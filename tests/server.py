"""The server launcher and /proc readers, kept importable here: they live in ``harness/server.py``
(shared with bench/). New code imports ``harness.server``."""

from harness.server import (  # noqa: F401  (re-exports)
    ROOT,
    ServerProcess,
    ServerStartError,
    SmithProcess,
    assert_clean_log,
    descendants,
    is_child_guard,
    parent_of,
    pid_alive,
    wait_until,
)
