"""No import circles inside smith_fast/: every import counts, at run time or for a type checker.

The graph is read from the source (``ast``), not from ``sys.modules``, so an import that only a
type checker follows (under ``if TYPE_CHECKING:``) or that runs late (inside a function) is an edge
like any other: a circle hidden that way is still two modules that cannot be understood, tested or
changed apart. A failure names each circle, with the import lines that close it.
"""

from __future__ import annotations

import ast
import pathlib
from collections import deque

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "smith_fast"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _compiled() -> frozenset[str]:
    """The extension modules built from ``csrc/`` (``setup.py``): ``smith_fast._framing_c`` ...
    An import of one is an import of that module, a leaf here (its source is not Python), not of
    the package it sits in."""
    sources = [*ROOT.glob("csrc/*.pyx"), *ROOT.glob("csrc/*_c.py")]
    return frozenset(f"smith_fast.{path.stem}" for path in sources)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name ``from <level dots><target> import ...`` means inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: line of the first such import}}``, smith_fast modules only."""
    modules = _modules()
    compiled = _compiled()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    # ``from pkg import sub`` imports the submodule when there is one.
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules or sub in compiled else base)
            for target in targets:
                if target in compiled or target.rpartition(".")[0] in compiled:
                    continue
                # ``import a.b.c`` binds a.b.c; the nearest smith_fast module that exists is the edge.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def _components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return sorted(found)


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str, members: set[str]) -> list[str]:
    """A shortest path start -> ... -> start inside one component (breadth first)."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a component but on no cycle")


def describe_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    modules = _modules()
    report = []
    for members in _components(graph):
        member_set = set(members)
        lines = [f"circle of {len(members)} modules: {', '.join(members)}"]
        covered: set[tuple[str, str]] = set()
        for start in members:
            cycle = _shortest_cycle(graph, start, member_set)
            hops = list(zip(cycle, cycle[1:]))
            if set(hops) <= covered:
                continue
            covered.update(hops)
            steps = [
                f"{a} -> {b} ({modules[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in hops
            ]
            lines.append("  " + "; ".join(steps))
        report.append("\n".join(lines))
    return report


def test_the_graph_sees_every_kind_of_import() -> None:
    """The walker finds run-time, TYPE_CHECKING-only, function-level and relative imports."""
    graph = import_graph()
    # framing.py: ``from ._compat import NO_EXTENSIONS`` (relative, at run time)
    assert "smith_fast._compat" in graph["smith_fast.framing"]
    # _sequencing_py.py: ``from .pb import smith_pb2`` under ``if TYPE_CHECKING:`` (package -> submodule)
    assert "smith_fast.pb.smith_pb2" in graph["smith_fast._sequencing_py"]
    # tools/__init__.py: absolute imports of its submodules
    assert "smith_fast.tools.registry" in graph["smith_fast.tools"]
    # chunking.py: ``from ._chunking_c import ...`` is the compiled module's, not the package's
    assert "smith_fast._chunking_c" in _compiled() and "smith_fast" not in graph["smith_fast.chunking"]
    # a circle is found, and named with the lines that close it
    toy = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    assert _components(toy) == [["a", "b", "c"]]
    assert _shortest_cycle(toy, "a", {"a", "b", "c"}) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    cycles = describe_cycles(import_graph())
    assert not cycles, "import circles in smith_fast/ (break each with a narrow Protocol or a value):\n" + "\n".join(
        cycles
    )
