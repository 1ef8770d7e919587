"""The repository stands alone: nothing in it depends on files beside it, and every document the code
cites (``docs/PLANS.md``; PROTOCOL.md followed by a section name in quotes) is in it, with the
section it names."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What a plain clone holds and `make test` reads; generated and installed files are not the repo's.
SCOPE = ("smith_fast/", "tests/", "bench/", "fuzz/", "proto/", "docs/", ".ci/")
TOP_LEVEL = ("Makefile", "setup.py", "pyproject.toml", "requirements-dev.txt")
# Written in pieces, so that this file does not match itself. The last one is how a test reached
# beside the repository before (ROOT being the repository's root).
OUTSIDE = (".." + "/shared", "wire_notes" + ".md", "shared" + "/spec", "ROOT" + ".parent")
# A cited Markdown file, optionally in ``backticks``, optionally followed by , "Section".
CITATION = re.compile(r'(?<![\w./-])(?P<file>[\w./-]*\w\.md)\b`{0,2}(?:\s*,\s*"(?P<section>[^"\n]+)")?')
# Headings, and the bold run-in labels that open a paragraph or a list item (**Trust.** ...).
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)
RUN_IN = re.compile(r"^\s*(?:[-*]\s+)?\*\*(?P<title>[^*\n]+?)\.?\*\*", re.MULTILINE)


def tracked_files() -> list[pathlib.Path]:
    """The files of the repository in scope: git's list in a checkout, else the tree on disk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    chosen = [n for n in names if n.startswith(SCOPE) or n in TOP_LEVEL or ("/" not in n and n.endswith(".md"))]
    return [ROOT / n for n in chosen if (ROOT / n).is_file()]


def text_files() -> dict[pathlib.Path, str]:
    texts = {}
    for path in tracked_files():
        if path.name == "package-lock.json":
            continue  # written by npm: its "SEE LICENSE IN <file>" are the packages' words, not citations
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary: corpus seeds, charts
        texts[path] = data.decode("utf-8", "replace")
    return texts


def normalize(title: str) -> str:
    return " ".join(title.replace("`", "").split()).casefold()


def sections(path: pathlib.Path) -> set[str]:
    text = path.read_text()
    return {normalize(m["title"]) for m in (*HEADING.finditer(text), *RUN_IN.finditer(text))}


def resolve(cited: str, citing: pathlib.Path) -> pathlib.Path | None:
    """The cited file, relative to the repository root or to the citing file's directory."""
    for base in (ROOT, citing.parent):
        candidate = (base / cited).resolve()
        if candidate.is_file() and candidate.is_relative_to(ROOT):
            return candidate
    return None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_nothing_refers_to_files_outside_the_repo() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line_of(text, text.find(word))}: {word}"
        for path, text in text_files().items()
        for word in OUTSIDE
        if word in text
    ]
    assert not offenders, "files outside the repository are referred to:\n" + "\n".join(offenders)


def test_cited_documents_and_sections_exist() -> None:
    missing = []
    checked = 0
    for path, text in text_files().items():
        for match in CITATION.finditer(text):
            where = f"{path.relative_to(ROOT)}:{line_of(text, match.start())}"
            if match["file"] in ("report.md",):
                continue  # the name of a file `smith-fast bench` writes, not a citation
            target = resolve(match["file"], path)
            if target is None:
                missing.append(f"{where}: {match['file']} does not exist")
                continue
            checked += 1
            if match["section"] and normalize(match["section"]) not in sections(target):
                missing.append(f'{where}: {match["file"]} has no section "{match["section"]}"')
    assert not missing, "citations that lead nowhere:\n" + "\n".join(missing)
    assert checked > 20  # the pattern still finds the citations (PROTOCOL.md, docs/PLANS.md, HOOKS.md ...)


def test_the_citation_pattern_reads_the_forms_the_code_uses() -> None:
    # Guards the checker itself: each form, and what it must extract.
    forms = {
        'see PROTOCOL.md, "Envelope additions".': ("PROTOCOL.md", "Envelope additions"),
        'Rules (``docs/PLANS.md``, "Execution"):': ("docs/PLANS.md", "Execution"),
        "keys in ``docs/PLANS.md``)": ("docs/PLANS.md", None),
        "[HOOKS.md](HOOKS.md)": ("HOOKS.md", None),
        "(bench/results/report.md)": ("bench/results/report.md", None),
    }
    for text, (file, section) in forms.items():
        match = CITATION.search(text)
        assert match is not None, text
        assert (match["file"], match["section"]) == (file, section), text
    assert normalize("v1: varint-delimited `Envelope`s") == normalize("v1: varint-delimited Envelopes")
    assert "trust" in sections(ROOT / "HOOKS.md")  # a bold run-in label counts as a section
    assert "no such section" not in sections(ROOT / "PROTOCOL.md")
