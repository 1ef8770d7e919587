"""The layers of ARCHITECTURE.md hold: no module imports a layer above its own.

The layers are read from ARCHITECTURE.md's "Layers" block, so the document has to stay true: a
module in no layer fails, a file named there that does not exist fails, and so does every import
(at run time, under ``TYPE_CHECKING`` or inside a function: the graph of
``tests/test_import_cycles.py``) of a module in a higher layer.

The block's format: a line that starts in the first column names a layer (up to the first two
spaces), the layers from the top down; the lines below it, indented, continue it. In a layer's
text, every word that ends in ``.py`` or ``/`` is a module pattern relative to ``smith_fast/``:
a file (``service/core.py``), a directory and all beneath it (``mcp/``), or a glob
(``service/request*.py``). What stands in (parentheses) or [brackets] is commentary. A module
matched by several patterns belongs to the most specific one: a file over a glob over a
directory, then the longer pattern.
"""

from __future__ import annotations

import fnmatch
import pathlib
import re
from dataclasses import dataclass

import pytest

from tests.test_import_cycles import PACKAGE, ROOT, import_graph

ARCHITECTURE = ROOT / "ARCHITECTURE.md"
_PATTERN = re.compile(r"^[\w*?.\[\]/-]+(?:\.py|/)$")


@dataclass(frozen=True)
class Pattern:
    text: str
    layer: int

    @property
    def specificity(self) -> tuple[int, int]:
        if self.text.endswith("/"):
            kind = 0
        elif any(c in self.text for c in "*?["):
            kind = 1
        else:
            kind = 2
        return (kind, len(self.text))

    def matches(self, path: str) -> bool:
        if self.text.endswith("/"):
            return path.startswith(self.text)
        return fnmatch.fnmatchcase(path, self.text)


def _strip_commentary(text: str) -> str:
    """``text`` without what stands in (parentheses) or [brackets], nested or across lines."""
    out: list[str] = []
    depth = 0
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]" and depth:
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


def parse_layers(markdown: str) -> tuple[list[str], list[Pattern]]:
    """The layers' names, top first, and every module pattern with its layer's index."""
    section = re.split(r"^## Layers\n", markdown, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    names: list[str] = []
    texts: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            name, _, rest = line.strip().partition("  ")
            names.append(name)
            texts.append(rest)
        else:
            assert texts, f"the Layers block starts with an indented line: {line!r}"
            texts[-1] += "\n" + line
    patterns = [
        Pattern(word, index)
        for index, text in enumerate(texts)
        for word in _strip_commentary(text).split()
        if _PATTERN.match(word.rstrip(",;"))
    ]
    return names, [Pattern(p.text.rstrip(",;"), p.layer) for p in patterns]


def module_paths() -> dict[str, str]:
    """``{module name: its path relative to smith_fast/}``."""
    paths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path.relative_to(PACKAGE).as_posix()
    return paths


def assign(paths: dict[str, str], patterns: list[Pattern]) -> tuple[dict[str, Pattern], list[str]]:
    """Each module's pattern (the most specific that matches), and the problems found."""
    placed: dict[str, Pattern] = {}
    problems: list[str] = []
    for module, path in paths.items():
        found = sorted((p for p in patterns if p.matches(path)), key=lambda p: p.specificity, reverse=True)
        if not found:
            problems.append(f"smith_fast/{path} is in no layer: add it (or a pattern that covers it) to a layer")
            continue
        if len(found) > 1 and found[0].specificity == found[1].specificity and found[0].layer != found[1].layer:
            problems.append(f"smith_fast/{path} is in two layers: {found[0].text!r} and {found[1].text!r}")
        placed[module] = found[0]
    for pattern in patterns:
        exact = pattern.specificity[0] != 1
        if exact and not any(pattern.matches(path) for path in paths.values()):
            problems.append(f"{pattern.text!r} names nothing in smith_fast/: remove or correct it")
    return placed, problems


def upward_imports(graph: dict[str, dict[str, int]], placed: dict[str, Pattern], names: list[str]) -> list[str]:
    """Every import of a module in a higher layer (a smaller index: the block lists the top first)."""
    paths = module_paths()
    found = []
    for module, edges in sorted(graph.items()):
        if module not in placed:
            continue
        own = placed[module].layer
        for target, line in sorted(edges.items()):
            if target in placed and placed[target].layer < own:
                found.append(
                    f"smith_fast/{paths[module]}:{line} ({names[own]}) imports {target} ({names[placed[target].layer]})"
                )
    return found


def test_the_layers_block_parses() -> None:
    names, patterns = parse_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(names) == len(set(names)) >= 5, names
    assert {"cli", "fronts", "core", "session"} <= set(names), names
    # What the parser takes from a line, and what it leaves as commentary.
    toy = (
        "## Layers\n\nprose\n\n```\ntop      a.py (not b.py) pkg/\n         c/*.py [d.py]\n"
        "bottom   e.py  some words\n```\n\n## Next\n"
    )
    toy_names, toy_patterns = parse_layers(toy)
    assert toy_names == ["top", "bottom"]
    assert [(p.text, p.layer) for p in toy_patterns] == [("a.py", 0), ("pkg/", 0), ("c/*.py", 0), ("e.py", 1)]


def test_the_most_specific_pattern_places_a_module() -> None:
    patterns = [Pattern("replay/", 3), Pattern("replay/cli.py", 0), Pattern("service/request*.py", 2)]
    paths = {"smith_fast.replay.cli": "replay/cli.py", "smith_fast.replay.store": "replay/store.py",
             "smith_fast.service.request": "service/request.py", "smith_fast.x": "x.py"}
    placed, problems = assign(paths, patterns)
    assert placed["smith_fast.replay.cli"].layer == 0 and placed["smith_fast.replay.store"].layer == 3
    assert placed["smith_fast.service.request"].layer == 2
    assert problems == ["smith_fast/x.py is in no layer: add it (or a pattern that covers it) to a layer"]
    # A named file that is gone is a stale document; a glob that matches nothing yet is a rule.
    _, problems = assign({"smith_fast.y": "y.py"}, [Pattern("y.py", 0), Pattern("gone.py", 0), Pattern("new*.py", 0)])
    assert problems == ["'gone.py' names nothing in smith_fast/: remove or correct it"]


def test_an_upward_import_is_found() -> None:
    names = ["high", "low"]
    placed = {"smith_fast.a": Pattern("a.py", 0), "smith_fast.b": Pattern("b.py", 1)}
    graph = {"smith_fast.a": {"smith_fast.b": 3}, "smith_fast.b": {"smith_fast.a": 7}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(f"{__name__}.module_paths", lambda: {"smith_fast.a": "a.py", "smith_fast.b": "b.py"})
        assert upward_imports(graph, placed, names) == ["smith_fast/b.py:7 (low) imports smith_fast.a (high)"]


def test_every_module_is_in_one_layer() -> None:
    _, patterns = parse_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    _, problems = assign(module_paths(), patterns)
    assert not problems, "ARCHITECTURE.md's Layers block and smith_fast/ disagree:\n" + "\n".join(problems)


def test_no_module_imports_a_layer_above_its_own() -> None:
    names, patterns = parse_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    placed, _ = assign(module_paths(), patterns)
    found = upward_imports(import_graph(), placed, names)
    assert not found, (
        "imports of a higher layer (ARCHITECTURE.md, Layers): take a Protocol, a value or a callback instead,\n"
        "or move the module to the layer it belongs to:\n" + "\n".join(found)
    )
