"""The command line of a benchmark module run on its own (``python -m bench.bench_nats``, ...):
``--quick``, ``--json PATH``, the figures printed."""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["bench_main"]


def bench_main(prog: str, doc: str | None, scales: Mapping[str, Any], measure: Callable[[Any], dict[str, Any]],
               render: Callable[[dict[str, Any]], Iterable[str]], quick_help: str, argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0] if doc else None)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--json", type=pathlib.Path, metavar="PATH", help="write the figures there as JSON")
    args = p.parse_args(argv)
    result = measure(scales["quick" if args.quick else "full"])
    print("\n".join(render(result)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0
