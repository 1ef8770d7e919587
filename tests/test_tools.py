"""The tool registry and the built-in tools, run for real on a temporary workspace."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.tools import (
    ArgumentError,
    Tool,
    ToolContext,
    ToolOutcome,
    ToolRegistry,
    default_registry,
    tools_list_tool,
)

pytestmark = pytest.mark.timeout(60)

BUILTINS = ["fs.list", "fs.read", "fs.search", "fs.write", "shell.run", "tools.list"]
OBJECT: dict[str, Any] = {"type": "object"}


# --- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace holding a secret no tool may reach."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret\n")
    return path


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    (path / "hello.txt").write_text("hello\nworld\n")
    (path / "sub").mkdir()
    (path / "sub" / "nested.py").write_text("import os\nprint('Hello')\n")
    # Escape hatches the sandbox must refuse.
    (path / "link_file").symlink_to(outside / "secret.txt")
    (path / "link_dir").symlink_to(outside, target_is_directory=True)
    (path / "dangling").symlink_to(outside / "not-yet.txt")
    # A symlink that stays inside is fine.
    (path / "inner_link").symlink_to(path / "hello.txt")
    return path


@pytest.fixture
def ctx(root: Path) -> ToolContext:
    return ToolContext(root)


@pytest.fixture
def registry() -> ToolRegistry:
    return default_registry(entry_points=False)


def encode(args: dict[str, Any] | bytes) -> bytes:
    return args if isinstance(args, bytes) else json.dumps(args).encode()


async def call(
    registry: ToolRegistry,
    name: str,
    args: dict[str, Any] | bytes,
    ctx: ToolContext,
    timeout: float | None = None,
) -> ToolOutcome:
    return await registry.call(name, encode(args), ctx, timeout=timeout)


async def ok(registry: ToolRegistry, name: str, args: dict[str, Any] | bytes, ctx: ToolContext) -> Any:
    outcome = await call(registry, name, args, ctx)
    assert outcome.success, outcome.error
    assert outcome.error is None
    assert isinstance(outcome.duration_ms, int) and outcome.duration_ms >= 0
    return json.loads(outcome.result)


async def failed(registry: ToolRegistry, name: str, args: dict[str, Any] | bytes, ctx: ToolContext) -> str:
    outcome = await call(registry, name, args, ctx)
    assert not outcome.success
    assert outcome.result == b""
    assert outcome.error
    return outcome.error


async def denied(registry: ToolRegistry, name: str, args: dict[str, Any], ctx: ToolContext) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        await call(registry, name, args, ctx)
    assert info.value.code == smith_pb2.ERROR_CODE_PERMISSION_DENIED
    error: ProtocolError = info.value
    assert "outside the workspace root" in str(error)
    return error


# --- fs.read ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_read_text(registry: ToolRegistry, ctx: ToolContext) -> None:
    outcome = await call(registry, "fs.read", {"path": "hello.txt"}, ctx)
    assert outcome.success
    # Compact JSON: no spaces after separators.
    assert outcome.result == (
        b'{"path":"hello.txt","content":"hello\\nworld\\n","size":12,'
        b'"offset":0,"length":12,"truncated":false}'
    )


@pytest.mark.asyncio
async def test_read_range_and_cap(registry: ToolRegistry, root: Path) -> None:
    (root / "digits.txt").write_text("0123456789" * 3)
    ctx = ToolContext(root)
    assert await ok(registry, "fs.read", {"path": "digits.txt", "offset": 5, "length": 4}, ctx) == {
        "path": "digits.txt",
        "content": "5678",
        "size": 30,
        "offset": 5,
        "length": 4,
        "truncated": False,
    }
    # Past the end: empty, not an error.
    got = await ok(registry, "fs.read", {"path": "digits.txt", "offset": 100}, ctx)
    assert (got["content"], got["truncated"]) == ("", False)
    # The output cap cuts the content short of what was asked, and says so.
    small = ToolContext(root, max_output=8)
    got = await ok(registry, "fs.read", {"path": "digits.txt"}, small)
    assert (got["content"], got["length"], got["truncated"]) == ("01234567", 8, True)
    got = await ok(registry, "fs.read", {"path": "digits.txt", "offset": 25}, small)
    assert (got["content"], got["truncated"]) == ("56789", False)


@pytest.mark.asyncio
async def test_read_window_ending_inside_a_character(
    registry: ToolRegistry, root: Path, ctx: ToolContext
) -> None:
    (root / "accents.txt").write_text("aé b", encoding="utf-8")  # é is 2 bytes: 61 c3 a9 20 62
    got = await ok(registry, "fs.read", {"path": "accents.txt", "length": 2}, ctx)
    # The half character is held back; ``length`` says where to continue.
    assert (got["content"], got["length"]) == ("a", 1)
    got = await ok(registry, "fs.read", {"path": "accents.txt", "offset": got["length"]}, ctx)
    assert (got["content"], got["length"]) == ("é b", 4)


@pytest.mark.asyncio
async def test_read_binary(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    blob = bytes(range(256))
    (root / "blob.bin").write_bytes(blob)
    error = await failed(registry, "fs.read", {"path": "blob.bin"}, ctx)
    assert error.startswith("ValueError: the file is not UTF-8 text (byte 128)")
    assert "base64" in error
    got = await ok(registry, "fs.read", {"path": "blob.bin", "encoding": "base64"}, ctx)
    assert base64.b64decode(got["content"]) == blob
    assert (got["size"], got["length"], got["truncated"]) == (256, 256, False)


@pytest.mark.asyncio
async def test_read_failures(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    assert (await failed(registry, "fs.read", {"path": "missing.txt"}, ctx)).startswith(
        "FileNotFoundError: no such file or directory: 'missing.txt'"
    )
    assert (await failed(registry, "fs.read", {"path": "sub"}, ctx)).startswith("IsADirectoryError")
    os.mkfifo(root / "fifo")
    # A FIFO must not hang the call.
    assert "not a regular file" in await failed(registry, "fs.read", {"path": "fifo"}, ctx)


# --- fs.write --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_write_then_read(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    got = await ok(registry, "fs.write", {"path": "new.txt", "content": "héllo"}, ctx)
    assert got == {"path": "new.txt", "bytes_written": 6}
    assert (root / "new.txt").read_text() == "héllo"
    got = await ok(registry, "fs.read", {"path": "new.txt"}, ctx)
    assert got["content"] == "héllo"


@pytest.mark.asyncio
async def test_write_replaces_atomically_and_keeps_mode(
    registry: ToolRegistry, root: Path, ctx: ToolContext
) -> None:
    target = root / "script.sh"
    target.write_text("old")
    target.chmod(0o751)
    await ok(registry, "fs.write", {"path": "script.sh", "content": "new"}, ctx)
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    # No temporary file is left behind.
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []


@pytest.mark.asyncio
async def test_write_new_file_mode_follows_umask(
    registry: ToolRegistry, root: Path, ctx: ToolContext
) -> None:
    await ok(registry, "fs.write", {"path": "fresh.txt", "content": ""}, ctx)
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE((root / "fresh.txt").stat().st_mode) == 0o666 & ~mask
    assert (root / "fresh.txt").read_bytes() == b""


@pytest.mark.asyncio
async def test_write_append(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    await ok(registry, "fs.write", {"path": "log.txt", "content": "a\n", "append": True}, ctx)
    got = await ok(registry, "fs.write", {"path": "log.txt", "content": "b\n", "append": True}, ctx)
    assert got == {"path": "log.txt", "bytes_written": 2}
    assert (root / "log.txt").read_text() == "a\nb\n"


@pytest.mark.asyncio
async def test_write_create_dirs(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    error = await failed(registry, "fs.write", {"path": "a/b/c.txt", "content": "x"}, ctx)
    assert error.startswith("FileNotFoundError") and "create_dirs" in error
    assert not (root / "a").exists()
    got = await ok(registry, "fs.write", {"path": "a/b/c.txt", "content": "x", "create_dirs": True}, ctx)
    assert got["path"] == "a/b/c.txt"
    assert (root / "a" / "b" / "c.txt").read_text() == "x"


@pytest.mark.asyncio
async def test_write_base64(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    blob = bytes(range(256)) * 3
    content = base64.b64encode(blob).decode()
    got = await ok(registry, "fs.write", {"path": "blob.bin", "content": content, "encoding": "base64"}, ctx)
    assert got["bytes_written"] == len(blob)
    assert (root / "blob.bin").read_bytes() == blob
    error = await failed(
        registry, "fs.write", {"path": "x.bin", "content": "not base64!", "encoding": "base64"}, ctx
    )
    assert error.startswith("args: invalid base64") and error.endswith("at $.content")
    assert not (root / "x.bin").exists()


@pytest.mark.asyncio
async def test_write_refuses_directories_and_lone_surrogates(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    assert (await failed(registry, "fs.write", {"path": "sub", "content": "x"}, ctx)).startswith(
        "IsADirectoryError"
    )
    assert (await failed(registry, "fs.write", {"path": ".", "content": "x"}, ctx)).startswith(
        "IsADirectoryError"
    )
    error = await failed(registry, "fs.write", b'{"path": "s.txt", "content": "a\\ud800"}', ctx)
    assert error == "args: unencodable character at index 1 at $.content"


# --- fs.list ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_list_top_level(registry: ToolRegistry, ctx: ToolContext) -> None:
    got = await ok(registry, "fs.list", {}, ctx)
    assert got["truncated"] is False
    assert got["entries"] == [
        {"name": "dangling", "path": "dangling", "type": "symlink", "size": 0},
        {"name": "hello.txt", "path": "hello.txt", "type": "file", "size": 12},
        {"name": "inner_link", "path": "inner_link", "type": "symlink", "size": 0},
        {"name": "link_dir", "path": "link_dir", "type": "symlink", "size": 0},
        {"name": "link_file", "path": "link_file", "type": "symlink", "size": 0},
        {"name": "sub", "path": "sub", "type": "dir", "size": 0},
    ]


@pytest.mark.asyncio
async def test_list_recursive(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "sub" / "deeper").mkdir()
    (root / "sub" / "deeper" / "z.txt").write_text("z")
    got = await ok(registry, "fs.list", {"recursive": True}, ctx)
    paths = [entry["path"] for entry in got["entries"]]
    # Breadth first, sorted per directory; .git shown but not entered; symlinks never followed.
    assert paths == [
        ".git",
        "dangling",
        "hello.txt",
        "inner_link",
        "link_dir",
        "link_file",
        "sub",
        "sub/deeper",
        "sub/nested.py",
        "sub/deeper/z.txt",
    ]
    got = await ok(registry, "fs.list", {"path": "sub", "recursive": True}, ctx)
    assert [entry["path"] for entry in got["entries"]] == ["sub/deeper", "sub/nested.py", "sub/deeper/z.txt"]
    assert got["entries"][1] == {"name": "nested.py", "path": "sub/nested.py", "type": "file", "size": 25}


@pytest.mark.asyncio
async def test_list_bounded(registry: ToolRegistry, ctx: ToolContext) -> None:
    got = await ok(registry, "fs.list", {"recursive": True, "max_entries": 3}, ctx)
    assert [entry["name"] for entry in got["entries"]] == ["dangling", "hello.txt", "inner_link"]
    assert got["truncated"] is True
    got = await ok(registry, "fs.list", {"path": "sub", "max_entries": 1}, ctx)
    assert got == {
        "entries": [{"name": "nested.py", "path": "sub/nested.py", "type": "file", "size": 25}],
        "truncated": False,
    }


@pytest.mark.asyncio
async def test_list_not_a_directory(registry: ToolRegistry, ctx: ToolContext) -> None:
    assert (await failed(registry, "fs.list", {"path": "hello.txt"}, ctx)).startswith("NotADirectoryError")
    assert (await failed(registry, "fs.list", {"path": "nope"}, ctx)).startswith("FileNotFoundError")


@pytest.mark.asyncio
async def test_list_undecodable_name(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    (root / "sub" / os.fsdecode(b"bad\xffname")).write_text("x")
    got = await ok(registry, "fs.list", {"path": "sub"}, ctx)
    assert got["entries"][0]["name"] == "bad\ufffdname"
    assert got["entries"][0]["path"] == "sub/bad\ufffdname"


# --- fs.search -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_search(registry: ToolRegistry, ctx: ToolContext) -> None:
    got = await ok(registry, "fs.search", {"pattern": r"^hel+o"}, ctx)
    assert got == {"matches": [{"path": "hello.txt", "line": 1, "text": "hello"}], "truncated": False}
    got = await ok(registry, "fs.search", {"pattern": "hello", "ignore_case": True}, ctx)
    assert got["matches"] == [
        {"path": "hello.txt", "line": 1, "text": "hello"},
        {"path": "sub/nested.py", "line": 2, "text": "print('Hello')"},
    ]
    got = await ok(registry, "fs.search", {"pattern": "o", "glob": "*.py"}, ctx)
    assert [(m["path"], m["line"]) for m in got["matches"]] == [("sub/nested.py", 1), ("sub/nested.py", 2)]
    got = await ok(registry, "fs.search", {"pattern": "o", "glob": "sub/*"}, ctx)
    assert {m["path"] for m in got["matches"]} == {"sub/nested.py"}
    # A single file as the path.
    got = await ok(registry, "fs.search", {"pattern": "world", "path": "hello.txt"}, ctx)
    assert got["matches"] == [{"path": "hello.txt", "line": 2, "text": "world"}]


@pytest.mark.asyncio
async def test_search_skips_binary_git_and_symlinks(
    registry: ToolRegistry, root: Path, ctx: ToolContext
) -> None:
    (root / "data.bin").write_bytes(b"needle\0\1\2")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("needle\n")
    (root / "ok.txt").write_text("a needle here\n")
    (root / "sub" / "link_to_ok").symlink_to(root / "ok.txt")
    got = await ok(registry, "fs.search", {"pattern": "needle"}, ctx)
    assert got["matches"] == [{"path": "ok.txt", "line": 1, "text": "a needle here"}]
    # The symlinks to outside (link_file, link_dir) are not followed either.
    got = await ok(registry, "fs.search", {"pattern": "secret"}, ctx)
    assert got == {"matches": [], "truncated": False}


@pytest.mark.asyncio
async def test_search_bounded(registry: ToolRegistry, root: Path) -> None:
    (root / "many.txt").write_text("".join(f"match {i}\n" for i in range(50)))
    ctx = ToolContext(root)
    got = await ok(registry, "fs.search", {"pattern": "match", "max_results": 7}, ctx)
    assert [m["line"] for m in got["matches"]] == list(range(1, 8))
    assert got["truncated"] is True
    got = await ok(registry, "fs.search", {"pattern": "match 4[0-9]"}, ctx)
    assert len(got["matches"]) == 10 and got["truncated"] is False
    # The byte budget bounds the results too.
    small = ToolContext(root, max_output=200)
    got = await ok(registry, "fs.search", {"pattern": "match", "max_results": 50}, small)
    assert 0 < len(got["matches"]) < 10
    assert got["truncated"] is True
    assert len(json.dumps(got["matches"], separators=(",", ":"))) <= 200


@pytest.mark.asyncio
async def test_search_long_line_excerpt(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    (root / "min.js").write_text("x" * 5000 + "NEEDLE" + "y" * 5000)
    got = await ok(registry, "fs.search", {"pattern": "NEEDLE"}, ctx)
    (match,) = got["matches"]
    assert len(match["text"]) == 1000
    assert "NEEDLE" in match["text"]


@pytest.mark.asyncio
async def test_search_invalid_regex(registry: ToolRegistry, ctx: ToolContext) -> None:
    error = await failed(registry, "fs.search", {"pattern": "(unclosed"}, ctx)
    assert error.startswith("args: invalid regular expression (missing ), unterminated subpattern")
    assert error.endswith("at $.pattern")


# --- shell.run -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shell_run(registry: ToolRegistry, ctx: ToolContext) -> None:
    got = await ok(registry, "shell.run", {"command": "echo out; echo err >&2; exit 3"}, ctx)
    usage = got.pop("usage")  # what it cost (smith_fast.containment.Usage; tests/test_containment.py)
    assert usage["limit_hit"] is None and usage["cpu_user_us"] >= 0 and usage["source"] in ("cgroup", "rusage")
    assert got == {
        "exit_code": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "truncated": False,
        "timed_out": False,
    }


@pytest.mark.asyncio
async def test_shell_run_cwd_and_env(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    got = await ok(registry, "shell.run", {"command": "pwd"}, ctx)
    assert got["stdout"] == f"{root}\n"
    got = await ok(
        registry, "shell.run", {"command": "pwd; echo $SMITH_X", "cwd": "sub", "env": {"SMITH_X": "42"}}, ctx
    )
    assert got["stdout"] == f"{root / 'sub'}\n42\n"
    assert got["exit_code"] == 0
    assert (await failed(registry, "shell.run", {"command": "pwd", "cwd": "hello.txt"}, ctx)).startswith(
        "NotADirectoryError"
    )


@pytest.mark.asyncio
async def test_shell_run_own_timeout_and_cap(registry: ToolRegistry, root: Path) -> None:
    ctx = ToolContext(root, max_output=100)
    got = await ok(registry, "shell.run", {"command": "sleep 5", "timeout_ms": 200}, ctx)
    assert got["timed_out"] is True
    got = await ok(registry, "shell.run", {"command": "head -c 1000 /dev/zero | tr '\\0' a"}, ctx)
    assert got["truncated"] is True
    assert got["stdout"] == "a" * 100


# --- the sandbox -----------------------------------------------------------------------------

ESCAPES = [
    ("fs.read", {"path": "../outside/secret.txt"}),
    ("fs.read", {"path": "sub/../../outside/secret.txt"}),
    ("fs.read", {"path": "link_file"}),
    ("fs.read", {"path": "link_dir/secret.txt"}),
    ("fs.read", {"path": "nonexistent/../../outside/secret.txt"}),
    ("fs.read", {"path": "dangling"}),
    ("fs.read", {"path": "/etc/passwd"}),
    ("fs.write", {"path": "../escaped.txt", "content": "x"}),
    ("fs.write", {"path": "link_dir/new.txt", "content": "x"}),
    ("fs.write", {"path": "link_dir/a/b.txt", "content": "x", "create_dirs": True}),
    ("fs.write", {"path": "dangling", "content": "x"}),
    ("fs.write", {"path": "link_file", "content": "x", "append": True}),
    ("fs.list", {"path": ".."}),
    ("fs.list", {"path": "link_dir"}),
    ("fs.list", {"path": "/"}),
    ("fs.search", {"pattern": "secret", "path": ".."}),
    ("fs.search", {"pattern": "secret", "path": "link_dir"}),
    ("fs.search", {"pattern": "secret", "path": "link_file"}),
    ("shell.run", {"command": "cat secret.txt", "cwd": ".."}),
    ("shell.run", {"command": "cat secret.txt", "cwd": "link_dir"}),
    ("shell.run", {"command": "pwd", "cwd": "/"}),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("tool", "args"), ESCAPES, ids=[f"{t}:{json.dumps(a)}" for t, a in ESCAPES])
async def test_escape_is_denied(
    registry: ToolRegistry, ctx: ToolContext, outside: Path, tool: str, args: dict[str, Any]
) -> None:
    error = await denied(registry, tool, args, ctx)
    assert error.details["path"] == args.get("path", args.get("cwd"))
    # Nothing was written outside, and the secret is intact.
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert not (outside.parent / "escaped.txt").exists()


@pytest.mark.asyncio
async def test_absolute_path_outside_with_existence_not_revealed(
    registry: ToolRegistry, ctx: ToolContext, outside: Path
) -> None:
    await denied(registry, "fs.read", {"path": str(outside / "secret.txt")}, ctx)
    await denied(registry, "fs.read", {"path": str(outside / "no-such-file")}, ctx)


@pytest.mark.asyncio
async def test_paths_that_stay_inside_are_allowed(
    registry: ToolRegistry, root: Path, ctx: ToolContext
) -> None:
    got = await ok(registry, "fs.read", {"path": str(root / "hello.txt")}, ctx)
    assert got["path"] == "hello.txt"
    got = await ok(registry, "fs.read", {"path": "sub/../hello.txt"}, ctx)
    assert got["path"] == "hello.txt"
    # A symlink inside the root to a file inside it is followed; the result names the real file.
    got = await ok(registry, "fs.read", {"path": "inner_link"}, ctx)
    assert (got["path"], got["content"]) == ("hello.txt", "hello\nworld\n")
    got = await ok(registry, "fs.list", {"path": str(root)}, ctx)
    assert len(got["entries"]) == 6


@pytest.mark.asyncio
async def test_root_given_through_a_symlink(registry: ToolRegistry, root: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    ctx = ToolContext(alias)
    assert ctx.root == root.resolve()
    got = await ok(registry, "fs.read", {"path": str(alias / "hello.txt")}, ctx)
    assert got["path"] == "hello.txt"


@pytest.mark.asyncio
async def test_nul_byte_in_path(registry: ToolRegistry, ctx: ToolContext) -> None:
    error = await failed(registry, "fs.read", {"path": "hello.txt\u0000x"}, ctx)
    assert error == "ValueError: path contains a NUL byte: 'hello.txt\\x00x'"


def test_context_validation(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ToolContext(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        ToolContext(tmp_path / "file")
    with pytest.raises(ValueError, match="max_output"):
        ToolContext(tmp_path, max_output=0)
    ctx = ToolContext(tmp_path)
    assert ctx.resolve(".") == tmp_path.resolve()
    assert ctx.relative(tmp_path / "a" / "b") == "a/b"
    with pytest.raises(FileNotFoundError):
        ctx.resolve("nope")
    assert ctx.resolve("nope", must_exist=False) == tmp_path.resolve() / "nope"
    with pytest.raises(ProtocolError) as info:
        ctx.resolve("../nope", must_exist=False)
    assert info.value.code == smith_pb2.ERROR_CODE_PERMISSION_DENIED


# --- arguments -------------------------------------------------------------------------------

BAD_ARGS = [
    ("fs.read", {}, "args: 'path' is a required property at $"),
    ("fs.read", {"path": 5}, "args: 5 is not of type 'string' at $.path"),
    ("fs.read", {"path": ""}, "args: '' should be non-empty at $.path"),
    ("fs.read", {"path": "a", "offset": -1}, "args: -1 is less than the minimum of 0 at $.offset"),
    (
        "fs.read",
        {"path": "a", "encoding": "latin-1"},
        "args: 'latin-1' is not one of ['utf-8', 'base64'] at $.encoding",
    ),
    (
        "fs.read",
        {"path": "a", "extra": 1},
        "args: Additional properties are not allowed ('extra' was unexpected) at $",
    ),
    ("fs.read", ["a"], "args: ['a'] is not of type 'object' at $"),
    ("fs.write", {"path": "a"}, "args: 'content' is a required property at $"),
    (
        "fs.write",
        {"path": "a", "content": "x", "append": "yes"},
        "args: 'yes' is not of type 'boolean' at $.append",
    ),
    ("fs.list", {"max_entries": 0}, "args: 0 is less than the minimum of 1 at $.max_entries"),
    (
        "fs.search",
        {"pattern": "x", "max_results": 1.5},
        "args: 1.5 is not of type 'integer' at $.max_results",
    ),
    ("shell.run", {"command": "true", "env": {"A": 1}}, "args: 1 is not of type 'string' at $.env.A"),
    (
        "shell.run",
        {"command": "true", "timeout_ms": 0},
        "args: 0 is less than the minimum of 1 at $.timeout_ms",
    ),
    (
        "tools.list",
        {"verbose": True},
        "args: Additional properties are not allowed ('verbose' was unexpected) at $",
    ),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("tool", "args", "message"), BAD_ARGS, ids=[f"{t}:{json.dumps(a)}" for t, a, _ in BAD_ARGS]
)
async def test_schema_violation(
    registry: ToolRegistry, ctx: ToolContext, tool: str, args: Any, message: str
) -> None:
    assert await failed(registry, tool, json.dumps(args).encode(), ctx) == message


BAD_JSON = [
    (b'{"path": "a"', "args: invalid JSON: Expecting ',' delimiter at line 1, column 13 (char 12)"),
    (
        b"{'path': 'a'}",
        "args: invalid JSON: Expecting property name enclosed in double quotes at line 1, column 2 (char 1)",
    ),
    (b'{"path": "\xff"}', "args: invalid UTF-8 at byte 10"),
    (b'{"path": "a", "offset": NaN}', "args: invalid JSON: NaN is not a JSON value"),
    (b"   ", "args: invalid JSON: Expecting value at line 1, column 4 (char 3)"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("raw", "message"), BAD_JSON, ids=[repr(raw) for raw, _ in BAD_JSON])
async def test_bad_json(registry: ToolRegistry, ctx: ToolContext, raw: bytes, message: str) -> None:
    assert await failed(registry, "fs.read", raw, ctx) == message


@pytest.mark.asyncio
async def test_empty_args_mean_an_empty_object(registry: ToolRegistry, ctx: ToolContext) -> None:
    assert await failed(registry, "fs.read", b"", ctx) == "args: 'path' is a required property at $"
    got = await ok(registry, "tools.list", b"", ctx)
    assert len(got["tools"]) == len(BUILTINS)


def test_argument_error_round_trips() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(ArgumentError("bad", "$.x")))
    assert (str(error), error.reason, error.path) == ("args: bad at $.x", "bad", "$.x")
    assert isinstance(error, ValueError)


# --- the registry ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_unknown_tool(registry: ToolRegistry, ctx: ToolContext) -> None:
    with pytest.raises(ProtocolError) as info:
        await registry.call("fs.delete", b"{}", ctx)
    assert info.value.code == smith_pb2.ERROR_CODE_INVALID_TOOL
    assert str(info.value) == "unknown tool 'fs.delete'"
    assert info.value.details == {"tool": "fs.delete"}
    with pytest.raises(ProtocolError) as info:
        registry.get("nope")
    assert info.value.code == smith_pb2.ERROR_CODE_INVALID_TOOL
    assert "nope" not in registry
    assert registry.get("fs.read").name == "fs.read"


def test_default_registry(registry: ToolRegistry) -> None:
    assert registry.names() == BUILTINS
    assert len(registry) == len(BUILTINS)
    assert [tool.name for tool in registry.tools()] == BUILTINS


async def _echo(args: Any, ctx: ToolContext) -> Any:
    return args


def test_register_rejects_bad_tools(registry: ToolRegistry) -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Tool("fs.read", "Another.", OBJECT, _echo))
    with pytest.raises(ValueError, match="invalid tool name"):
        registry.register(Tool("has space", "Echo.", OBJECT, _echo))
    with pytest.raises(ValueError, match="one non-empty line"):
        registry.register(Tool("echo", "Two\nlines.", OBJECT, _echo))
    with pytest.raises(ValueError, match="one non-empty line"):
        registry.register(Tool("echo", " ", OBJECT, _echo))
    with pytest.raises(ValueError, match=r"tool 'echo': invalid JSON Schema at \$.type"):
        registry.register(Tool("echo", "Echo.", {"type": "thing"}, _echo))
    with pytest.raises(ValueError, match="not JSON-serializable"):
        registry.register(Tool("echo", "Echo.", {"default": {1, 2}}, _echo))
    with pytest.raises(TypeError, match="expected a Tool"):
        registry.register({"name": "echo"})  # type: ignore[arg-type]
    assert registry.names() == BUILTINS


@pytest.mark.asyncio
async def test_custom_tool_and_result_encoding(registry: ToolRegistry, ctx: ToolContext) -> None:
    registry.register(
        Tool("echo", "Return the arguments.", {"type": "array", "items": {"type": "integer"}}, _echo)
    )
    outcome = await registry.call("echo", b"[1, 2, 3]", ctx)
    assert (outcome.success, outcome.result) == (True, b"[1,2,3]")
    assert await failed(registry, "echo", b'[1, "2"]', ctx) == "args: '2' is not of type 'integer' at $[1]"

    async def bad_result(args: Any, ctx: ToolContext) -> Any:
        return {"value": float("nan")}

    async def not_json(args: Any, ctx: ToolContext) -> Any:
        return {1, 2}

    async def unicode(args: Any, ctx: ToolContext) -> Any:
        return {"text": "ünï ☃"}

    async def nap(args: Any, ctx: ToolContext) -> Any:
        await asyncio.sleep(0.1)

    registry.register(Tool("nap", "Sleep a little.", OBJECT, nap))
    outcome = await registry.call("nap", b"{}", ctx)
    assert (outcome.success, outcome.result) == (True, b"null")
    assert outcome.duration_ms >= 100

    registry.register(Tool("nan", "NaN.", OBJECT, bad_result))
    registry.register(Tool("set", "A set.", OBJECT, not_json))
    registry.register(Tool("uni", "Unicode.", OBJECT, unicode))
    assert (
        await failed(registry, "nan", b"{}", ctx)
        == "ValueError: Out of range float values are not JSON compliant"
    )
    assert (
        await failed(registry, "set", b"{}", ctx) == "TypeError: Object of type set is not JSON serializable"
    )
    assert (await registry.call("uni", b"{}", ctx)).result == '{"text":"ünï ☃"}'.encode()


@pytest.mark.asyncio
async def test_handler_exceptions_fail_the_call(registry: ToolRegistry, ctx: ToolContext) -> None:
    async def boom(args: Any, ctx: ToolContext) -> Any:
        raise RuntimeError("boom")

    async def silent(args: Any, ctx: ToolContext) -> Any:
        raise KeyError

    async def own_timeout(args: Any, ctx: ToolContext) -> Any:
        raise TimeoutError("the backend timed out")

    async def protocol(args: Any, ctx: ToolContext) -> Any:
        raise ProtocolError("no", smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED)

    async def long_error(args: Any, ctx: ToolContext) -> Any:
        raise ValueError("x" * 10_000)

    for tool in [
        Tool("boom", "Raise.", OBJECT, boom),
        Tool("silent", "Raise.", OBJECT, silent),
        Tool("own_timeout", "Raise.", OBJECT, own_timeout),
        Tool("protocol", "Raise.", OBJECT, protocol),
        Tool("long_error", "Raise.", OBJECT, long_error),
    ]:
        registry.register(tool)
    assert await failed(registry, "boom", b"{}", ctx) == "RuntimeError: boom"
    assert await failed(registry, "silent", b"{}", ctx) == "KeyError"
    # A TimeoutError of the tool's own is a failure of the tool, not the call's timeout.
    outcome = await registry.call("own_timeout", b"{}", ctx, timeout=30)
    assert (outcome.success, outcome.error) == (False, "TimeoutError: the backend timed out")
    with pytest.raises(ProtocolError) as info:
        await registry.call("protocol", b"{}", ctx)
    assert info.value.code == smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED
    error = await failed(registry, "long_error", b"{}", ctx)
    assert len(error) == 4096 and error.endswith("...")


# --- timeouts and concurrency ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_timeout_cancels_the_handler(registry: ToolRegistry, ctx: ToolContext) -> None:
    cleaned_up = asyncio.Event()

    async def slow(args: Any, ctx: ToolContext) -> Any:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned_up.set()

    registry.register(Tool("slow", "Sleep.", OBJECT, slow))
    with pytest.raises(ProtocolError) as info:
        await registry.call("slow", b"{}", ctx, timeout=0.05)
    assert info.value.code == smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT
    assert str(info.value).startswith("tool 'slow' timed out after ")
    assert info.value.details["tool"] == "slow"
    assert info.value.details["timeout_ms"] == "50"
    assert int(info.value.details["duration_ms"]) >= 50
    # The handler had finished its cleanup before call() raised.
    assert cleaned_up.is_set()
    # A generous timeout changes nothing for a fast call.
    assert (await registry.call("tools.list", b"{}", ctx, timeout=30)).success


@pytest.mark.asyncio
async def test_shell_timeout_kills_the_child(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    with pytest.raises(ProtocolError) as info:
        await call(registry, "shell.run", {"command": "echo $$ > pid; exec sleep 5"}, ctx, timeout=0.5)
    assert info.value.code == smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT
    pid = int((root / "pid").read_text())
    # `exec` made the shell's pid the sleep's. It was SIGKILLed before call() raised; the event
    # loop reaps it in the background, so give the loop a moment (bounded) to do so.
    for _ in range(250):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.02)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.asyncio
async def test_calls_run_concurrently(registry: ToolRegistry, ctx: ToolContext) -> None:
    n = 12
    barrier = asyncio.Barrier(n)

    async def meet(args: Any, ctx: ToolContext) -> Any:
        # Completes only if all n calls are in flight at once.
        await barrier.wait()
        return args["i"]

    registry.register(Tool("meet", "Wait for the others.", OBJECT, meet))
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(registry.call("meet", encode({"i": i}), ctx) for i in range(n))), timeout=10
    )
    assert [o.result for o in outcomes] == [str(i).encode() for i in range(n)]


@pytest.mark.asyncio
async def test_mixed_concurrent_calls(registry: ToolRegistry, root: Path, ctx: ToolContext) -> None:
    writes = [
        call(registry, "fs.write", {"path": f"c/{i}.txt", "content": f"n{i}", "create_dirs": True}, ctx)
        for i in range(20)
    ]
    assert all(o.success for o in await asyncio.gather(*writes)), "a write failed"
    reads = [call(registry, "fs.read", {"path": f"c/{i}.txt"}, ctx) for i in range(20)]
    shells = [call(registry, "shell.run", {"command": f"echo {i}"}, ctx) for i in range(5)]
    searches = [call(registry, "fs.search", {"pattern": f"^n{i}$", "path": "c"}, ctx) for i in range(5)]
    outcomes = await asyncio.gather(*reads, *shells, *searches)
    assert [json.loads(o.result)["content"] for o in outcomes[:20]] == [f"n{i}" for i in range(20)]
    assert [json.loads(o.result)["stdout"] for o in outcomes[20:25]] == [f"{i}\n" for i in range(5)]
    assert [json.loads(o.result)["matches"][0]["path"] for o in outcomes[25:]] == [
        f"c/{i}.txt" for i in range(5)
    ]


# --- tools.list ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_tools_list(registry: ToolRegistry, ctx: ToolContext) -> None:
    got = await ok(registry, "tools.list", {}, ctx)
    assert [tool["name"] for tool in got["tools"]] == BUILTINS
    for listed in got["tools"]:
        tool = registry.get(listed["name"])
        assert listed["description"] == tool.description
        assert "\n" not in listed["description"]
        assert listed["schema"] == tool.schema
        assert listed["schema"]["type"] == "object"
        assert listed["schema"]["additionalProperties"] is False
    # Tools registered later are listed too.
    registry.register(Tool("echo", "Return the arguments.", OBJECT, _echo))
    got = await ok(registry, "tools.list", {}, ctx)
    assert "echo" in [tool["name"] for tool in got["tools"]]


@pytest.mark.asyncio
async def test_tools_list_on_a_custom_registry(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(tools_list_tool(registry))
    got = await ok(registry, "tools.list", {}, ctx)
    assert [tool["name"] for tool in got["tools"]] == ["tools.list"]


# --- entry points ----------------------------------------------------------------------------

PLUGIN = "smith_fast_test_plugin"


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution with tool entry points, good and broken, on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{PLUGIN}.py").write_text(
        textwrap.dedent(
            """
            from smith_fast.tools import Tool

            async def _shout(args, ctx):
                return args["text"].upper()

            async def _whisper(args, ctx):
                return args["text"].lower()

            SCHEMA = {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            }
            SHOUT = Tool("demo.shout", "Upper-case a text.", SCHEMA, _shout)

            def make_tools():
                return [Tool("demo.whisper", "Lower-case a text.", SCHEMA, _whisper)]

            NOT_A_TOOL = 42
            CLASHING = Tool("fs.read", "A second fs.read.", SCHEMA, _shout)

            def raising():
                raise RuntimeError("factory failed")
            """
        )
    )
    dist_info = site / f"{PLUGIN}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""
            [smith_fast.tools]
            shout = {PLUGIN}:SHOUT
            whisper = {PLUGIN}:make_tools
            missing_module = {PLUGIN}_nope:TOOL
            missing_attr = {PLUGIN}:NOPE
            not_a_tool = {PLUGIN}:NOT_A_TOOL
            clashing = {PLUGIN}:CLASHING
            raising = {PLUGIN}:raising
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop(PLUGIN, None)


@pytest.mark.asyncio
async def test_entry_point_tools(
    plugin_path: Path, ctx: ToolContext, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="smith_fast.tools"):
        registry = default_registry()
    assert registry.names() == sorted([*BUILTINS, "demo.shout", "demo.whisper"])
    assert await ok(registry, "demo.shout", {"text": "hi"}, ctx) == "HI"
    assert await ok(registry, "demo.whisper", {"text": "HI"}, ctx) == "hi"
    assert (
        await failed(registry, "demo.shout", {"text": 1}, ctx) == "args: 1 is not of type 'string' at $.text"
    )
    # The built-in fs.read was not replaced.
    assert registry.get("fs.read").description.startswith("Read a file")
    # Every broken entry point was logged, naming it, and skipped.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for name in ["missing_module", "missing_attr", "not_a_tool", "clashing", "raising"]:
        assert f"entry point {name} = " in logged
    assert "already registered" in logged
    assert all(record.name == "smith_fast.tools" for record in caplog.records)
    # tools.list shows the plug-in tools.
    listed = await ok(registry, "tools.list", {}, ctx)
    assert {
        "name": "demo.shout",
        "description": "Upper-case a text.",
        "schema": registry.get("demo.shout").schema,
    } in listed["tools"]


def test_entry_points_can_be_left_out(plugin_path: Path) -> None:
    assert default_registry(entry_points=False).names() == BUILTINS


def test_fs_list_cancelled_before_its_thread_ran_closes_its_directory_fd(tmp_path: Path) -> None:
    """A cancel that comes while the executor is busy cancels fs.list's work item before any thread
    took the directory fd it opened: the call closes it (it leaked before; a busy service then
    kept one fd per cancelled listing)."""
    import asyncio
    import concurrent.futures
    import os
    import threading

    from smith_fast.tools.fs import FS_LIST

    ctx = ToolContext(tmp_path)
    release = threading.Event()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(pool)
        blocker = loop.run_in_executor(None, release.wait)  # the one thread is busy
        before = len(os.listdir("/proc/self/fd"))
        task = asyncio.ensure_future(FS_LIST.handler({}, ctx))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = len(os.listdir("/proc/self/fd"))
        release.set()
        await blocker
        pool.shutdown()
        return after - before

    assert asyncio.run(main()) == 0
