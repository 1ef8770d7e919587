"""smith_fast/, bench/ and harness/ type-check: mypy, configured in pyproject.toml ``[tool.mypy]``, finds no error.

Run as a subprocess with the venv's mypy (pinned in requirements-dev.txt), from the repository root
so that it reads the project's configuration; a failure prints mypy's report.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def run_mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, timeout=540
    )


def test_mypy_finds_no_error() -> None:
    result = run_mypy()
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"
    assert re.search(r"Success: no issues found in \d+ source files", result.stdout), result.stdout


# What a user of the facades writes. Each facade picks its twin at run time; a checker must still
# see the Python twin's annotations through it, so nothing here may be Any.
TYPED_USE = """\
# mypy: disallow-any-expr
from smith_fast import chunking, coalescing, events, framing, sequencing

decoder = framing.FrameDecoder(max_frame_size=1024)
frames: list[bytes] = decoder.feed(b"\\x01a")
wire: bytes = framing.encode_frame(b"x") + framing.encode_frames([b"a"]) + framing.encode_varint(5)
end: int = framing.varint_size(300) + framing.encode_into([b"a"], bytearray()) + decoder.offset
frame: bytes = events.encode_log(1, 2, 3, "m") + events.encode_shell_output(1, 2, "r", stdout="o")
chunker = chunking.OutputChunker(max_chunk=chunking.DEFAULT_MAX_CHUNK)
stamped: tuple[int, int] = sequencing.Sequencer().next()
delivered: list[object] = sequencing.Resequencer(window=8).push(1, "item")
batches: list[bytes] = coalescing.EventBatcher(8, 4096, 0.001).add(b"event")
twins: list[str] = [chunking.IMPLEMENTATION, coalescing.IMPLEMENTATION, events.IMPLEMENTATION,
                    framing.IMPLEMENTATION, sequencing.IMPLEMENTATION]
"""

# The same facades misused: a checker that sees their types reports every line.
MISUSE = {
    "framing.FrameDecoder(max_frame_size='big')": "arg-type",
    "events.encode_log(1, 2, 3, b'not a str')": "arg-type",
    "chunking.OutputChunker().feed(42)": "arg-type",
    "sequencing.Sequencer().next(1)": "call-arg",
    "coalescing.WriteCoalescer().add(3.5)": "arg-type",
}


def test_facades_show_the_typed_twin(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "typed_use.py"
    good.write_text(TYPED_USE)
    result = run_mypy(str(good))
    assert result.returncode == 0, f"the facades look untyped to a checker:\n{result.stdout}{result.stderr}"

    bad = tmp_path / "misuse.py"
    bad.write_text(
        "from smith_fast import chunking, coalescing, events, framing, sequencing\n" + "\n".join(MISUSE) + "\n"
    )
    result = run_mypy(str(bad))
    for line, (call, code) in enumerate(MISUSE.items(), start=2):
        assert re.search(rf"misuse\.py:{line}: error: .*\[{code}\]", result.stdout), (
            f"mypy did not catch {call}:\n{result.stdout}{result.stderr}"
        )


def _skipped_modules() -> list[str]:
    """The module patterns pyproject.toml exempts from checking (``ignore_errors = true``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns: list[str] = []
    for override in config["tool"]["mypy"].get("overrides", []):
        if override.get("ignore_errors"):
            modules = override["module"]
            patterns += [modules] if isinstance(modules, str) else modules
    return patterns


def _exempt(module: str, patterns: list[str]) -> bool:
    # mypy's rule: "a.b.*" matches a.b and everything under it; "a.b" only itself.
    return any(
        module == p or (p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1]))) for p in patterns
    )


IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)$")
GOOD_IGNORE = re.compile(r"^\[[a-z0-9-]+(,\s*[a-z0-9-]+)*\]\s+#\s*\S")


def test_every_type_ignore_names_its_code_and_reason() -> None:
    patterns = _skipped_modules()
    bad = []
    for path in sorted((ROOT / "smith_fast").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if _exempt(".".join(parts), patterns):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = IGNORE.search(line)
            if match and not GOOD_IGNORE.match(match.group("rest")):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "a `type: ignore` needs `[error-code]  # why`:\n" + "\n".join(bad)


def test_the_ignore_rule_itself() -> None:
    assert GOOD_IGNORE.match("[arg-type]  # a probe")
    assert not GOOD_IGNORE.match("[arg-type]")
    assert not GOOD_IGNORE.match("  # no code")
    assert _exempt("smith_fast.service.session", ["smith_fast.service.*"])
    assert _exempt("smith_fast.service", ["smith_fast.service.*"])
    assert not _exempt("smith_fast.services", ["smith_fast.service.*"])
    assert not _exempt("smith_fast.client2", ["smith_fast.client"])
