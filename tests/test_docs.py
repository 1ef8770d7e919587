"""The documentation stays navigable: short lines, links that land, a table of contents, no tracker.

* No line of a Markdown file of the repository (but a generated report) is over ``MAX_LINE``
  characters: prose is wrapped, table rows go on in continuation rows, code blocks are wrapped too.
* Every internal link (``[text](#anchor)``, or one to a heading of another Markdown file of the
  repository) names a heading that exists, by GitHub's anchor rules, and the linked file exists.
* PROTOCOL.md's table of contents (its ``## Contents`` section) links every ``##`` heading.
* No comment or docstring under smith_fast/, csrc/, tests/, bench/, harness/ or fuzz/, and no
  Markdown text, cites a tracker number ("issue" and a number): a reader has no access to our
  tracker, so the text says what it means instead.

Each failure names the file and line, so the fix is a look away.
"""

from __future__ import annotations

import ast
import io
import os
import pathlib
import re
import tokenize
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINE = 200
# Not the repository's own text: installed packages, build output, Node modules, VCS metadata.
SKIPPED_DIRS = {"build", "dist", "node_modules", "__pycache__"}
# Written by `make bench` (bench/report/render.py): its paragraphs and table rows are one line each,
# and tests/test_bench_report.py reads them so; its links and text are still checked.
GENERATED = {"bench/results/report.md"}
# A tracker number: "issue" or "issues", then a number (after a "#" or not), in any case.
TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
CODE_DIRS = ("smith_fast", "csrc", "tests", "bench", "harness", "fuzz")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
# [text](target) with target a relative .md file and/or #anchor; not an image's or a URL's.
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]*)\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRS or name.endswith(".egg-info")


def _walk(top: pathlib.Path, suffixes: tuple[str, ...]) -> Iterator[pathlib.Path]:
    # pruned as it goes: .venv and the interop node_modules hold ~100,000 files (7.8 s of rglob)
    found = []
    for here, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        found += [pathlib.Path(here, name) for name in files if name.endswith(suffixes)]
    yield from sorted(found)


def markdown_files() -> list[pathlib.Path]:
    return list(_walk(ROOT, (".md",)))


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before de-duplication).

    Lower case; every character but letters, digits, ``-``, ``_`` and spaces dropped (so backquotes,
    brackets and punctuation go); each space becomes ``-`` (runs are not collapsed).
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text)
    kept = [ch for ch in text.lower() if ch.isalnum() or ch in "-_ "]
    return "".join(kept).replace(" ", "-")


def headings(text: str) -> list[tuple[int, int, str, str]]:
    """``(line, level, text, anchor)`` of each heading, anchors de-duplicated as GitHub does."""
    seen: dict[str, int] = {}
    found = []
    for number, line in prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        anchor = base if base not in seen else f"{base}-{seen[base]}"
        seen[base] = seen.get(base, 0) + 1
        found.append((number, len(match.group(1)), match.group(2), anchor))
    return found


def anchors(text: str) -> set[str]:
    names = {anchor for _, _, _, anchor in headings(text)}
    names.update(_HTML_ANCHOR.findall(text))
    return names


def links(text: str) -> Iterator[tuple[int, str]]:
    """``(line, target)`` of each link in the prose (not in code blocks or code spans)."""
    for number, line in prose_lines(text):
        for match in _LINK.finditer(_CODE_SPAN.sub("", line)):
            yield number, match.group(1)


def test_markdown_lines_are_at_most_200_characters() -> None:
    long = [
        f"{_rel(path)}:{number}: {len(line)} characters"
        for path in markdown_files()
        if _rel(path) not in GENERATED
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE
    ]
    assert markdown_files(), "no Markdown file found"
    assert not long, f"{len(long)} Markdown lines over {MAX_LINE} characters:\n" + "\n".join(long)


def test_internal_links_resolve() -> None:
    checked = 0
    broken = []
    for path in markdown_files():
        for number, target in links(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            file_part, _, anchor = target.partition("#")
            if file_part and not file_part.endswith(".md"):
                continue  # a source file or directory: its existence is not this test's
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{_rel(path)}:{number}: ({target})"
            checked += 1
            if not linked.is_file():
                broken.append(f"{where}: no such file")
            elif anchor and anchor not in anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{where}: no heading with the anchor #{anchor} in {_rel(linked)}")
    assert checked, "no internal link found: the link pattern no longer matches"
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


def test_protocol_contents_list_every_section() -> None:
    text = (ROOT / "PROTOCOL.md").read_text(encoding="utf-8")
    found = headings(text)
    contents = [h for h in found if h[1] == 2 and h[2] == "Contents"]
    assert contents, "PROTOCOL.md has no '## Contents' section"
    start = contents[0][0]
    end = next((line for line, _, _, _ in found if line > start), len(text.splitlines()) + 1)
    listed = {
        target.removeprefix("#")
        for number, target in links(text)
        if start < number < end and target.startswith("#")
    }
    sections = [(line, title, anchor) for line, level, title, anchor in found if level == 2]
    missing = [
        f"line {line}: ## {title} (#{anchor})"
        for line, title, anchor in sections
        if title != "Contents" and anchor not in listed
    ]
    assert len(sections) > 1
    assert not missing, "PROTOCOL.md's contents miss these sections:\n" + "\n".join(missing)


def _python_comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].lineno, body[0].value.value


def _cited(path: pathlib.Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    if not TRACKER.search(text):  # nothing anywhere: no need to tell its prose from its code
        return
    if path.suffix == ".py":
        pieces: Iterator[tuple[int, str]] = _python_comments_and_docstrings(text)
    else:  # Cython and C: comments are the only prose there, so all of the text is read
        pieces = enumerate(text.splitlines(), 1)
    for number, piece in pieces:
        for match in TRACKER.finditer(piece):
            line = number + piece.count("\n", 0, match.start())
            yield f"{_rel(path)}:{line}: {match.group(0)!r}"


def test_no_comment_or_document_cites_a_tracker_number() -> None:
    sources = [
        path
        for top in CODE_DIRS
        for path in _walk(ROOT / top, (".py", ".pyx", ".pxd", ".c", ".h"))
        if not path.name.endswith("_pb2.py") and not path.name.endswith("_pb2_grpc.py")
    ]
    assert len(sources) > 50, "the source tree was not found"
    cited = [hit for path in sources for hit in _cited(path)]
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            cited.extend(f"{_rel(path)}:{number}: {m.group(0)!r}" for m in TRACKER.finditer(line))
    assert not cited, "say what is meant instead of citing the tracker:\n" + "\n".join(cited)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("v1: varint-delimited `Envelope`s", "v1-varint-delimited-envelopes"),
        ("Planners (`serve --planner rules|llm`)", "planners-serve---planner-rulesllm"),
        ('Execution (`context["execute"] = "true"`)', "execution-contextexecute--true"),
        ("What a session's Rust hook may contain", "what-a-sessions-rust-hook-may-contain"),
        ("stdin, flow control", "stdin-flow-control"),
    ],
)
def test_github_anchor_rules(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_duplicate_headings_get_numbered_anchors() -> None:
    text = "# A\n## Process control\n```\n## not a heading\n```\n### Process control\n"
    assert [a for *_, a in headings(text)] == ["a", "process-control", "process-control-1"]
