"""What one ``fs.search`` call costs, start to end, through the tool registry (no socket).

Run: ``.venv/bin/pytest bench/bench_search.py --benchmark-only -p no:cacheprovider``

A workspace of :data:`FILES` small files; each round is one search that finds a few matches. The
cost is mostly rg's start (and the confinement of its process): the figure to watch when the way
rg is started changes.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from smith_fast.tools import ToolContext, default_registry

FILES = 200


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("search-bench")
    for i in range(FILES):
        sub = root / f"d{i % 10}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}.py").write_text("".join(f"line {n} of file {i}\n" for n in range(50)) + ("needle\n" if i % 40 == 0 else ""))
    return root


def test_fs_search_call(benchmark: Any, workspace: pathlib.Path) -> None:
    registry = default_registry(entry_points=False)
    ctx = ToolContext(workspace)
    loop = asyncio.new_event_loop()

    def one() -> int:
        out = loop.run_until_complete(registry.call("fs.search", b'{"pattern": "needle"}', ctx))
        assert out.success, out.error
        return len(out.result)

    try:
        assert one() > 0
        benchmark.pedantic(one, rounds=200, warmup_rounds=5)
    finally:
        loop.close()
