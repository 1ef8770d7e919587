"""``fs.search`` against a real ``smith-fast serve`` process: a pattern that backtracks for ages in
Python's ``re`` neither outlives its timeout nor stalls another session, .gitignored directories are
not searched, a huge single-line file does not bloat the service, and a timed-out search leaves no
``rg`` behind (findings of the hostile-input review, RELIABILITY.md)."""

from __future__ import annotations

import json
import pathlib
import shutil
import threading
import time
from typing import Any

import pytest

from smith_fast.pb import smith_pb2 as pb
from smith_fast.tools.search import MAX_LINE_CHARS, rg_path

from .peers import V1Peer, errors, kind, terminal
from .server import ServerProcess, assert_clean_log, descendants, wait_until

BIG = 200 * 1024 * 1024


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp(f"search-{request.param}")
    srv = ServerProcess(root, loop=request.param).start()
    yield srv
    shutil.rmtree(root / "huge", ignore_errors=True)  # 200 MB: not kept among pytest's old temp dirs
    assert srv.stop() == 0
    assert_clean_log(srv)


def tool_call(peer: V1Peer, rid: str, tool: str, args: dict[str, Any], timeout_ms: int | None = None) -> tuple[dict[str, Any] | None, list[pb.Envelope]]:
    cmd = pb.ToolCallCommand(request_id=rid, tool=tool, args=json.dumps(args).encode())
    if timeout_ms is not None:
        cmd.timeout_ms = timeout_ms
    peer.command(tool_call=cmd)
    envs = peer.until(terminal(rid))
    results = [e.event.tool_result for e in envs if kind(e) == "tool_result"]
    if results and results[0].success:
        return json.loads(results[0].result), envs
    return None, envs


def session(server: ServerProcess) -> V1Peer:
    peer = V1Peer(server.unix, timeout=120)
    peer.handshake(caps=())
    return peer


def rss_kib(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_rg_is_installed_beside_the_interpreter() -> None:
    assert pathlib.Path(rg_path()).is_file()


def test_catastrophic_backtracking_pattern_neither_overruns_nor_stalls(server: ServerProcess) -> None:
    # Python's re needs ~2^n steps for this pattern on n a's and one other character (25 took 5 s).
    hostile, honest = session(server), session(server)
    result, _ = tool_call(hostile, "w", "fs.write", {"path": "r.txt", "content": "a" * 40 + "!\n"})
    assert result == {"path": "r.txt", "bytes_written": 42}
    timeout_ms = 5000  # generous for a loaded machine; the re-based tool needed days for 40 a's
    answered: dict[str, float] = {}

    def other_session() -> None:
        time.sleep(0.05)  # once the hostile search is under way
        sent = time.monotonic()
        listed, _ = tool_call(honest, "l", "tools.list", {})
        assert listed is not None
        answered["tools.list"] = time.monotonic() - sent

    thread = threading.Thread(target=other_session)
    thread.start()
    sent = time.monotonic()
    result, envs = tool_call(hostile, "s", "fs.search", {"pattern": "(a+)+$", "path": "r.txt"}, timeout_ms=timeout_ms)
    answered["fs.search"] = time.monotonic() - sent
    thread.join(60)
    assert not errors(envs), errors(envs)
    assert result == {"matches": [], "truncated": False}
    # Both answered inside the hostile call's own timeout: the search did not block the loop.
    assert answered["fs.search"] < timeout_ms / 1000 and answered["tools.list"] < timeout_ms / 1000
    # The same engine still finds what it should.
    found, _ = tool_call(hostile, "s2", "fs.search", {"pattern": "(a+)+!$", "path": "r.txt"}, timeout_ms=timeout_ms)
    assert found == {"matches": [{"path": "r.txt", "line": 1, "text": "a" * 40 + "!"}], "truncated": False}


def test_gitignored_directories_are_not_searched(server: ServerProcess) -> None:
    root = server.root / "proj"
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "site.py").write_text("NEEDLE in the venv\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("NEEDLE in the build\n")
    (root / ".gitignore").write_text(".venv/\nbuild/\n")
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("# NEEDLE in the source\n")
    (root / ".hidden.cfg").write_text("NEEDLE hidden but not ignored\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("NEEDLE in git metadata\n")
    peer = session(server)
    result, _ = tool_call(peer, "g", "fs.search", {"pattern": "NEEDLE", "path": "proj"})
    assert result == {
        "matches": [
            {"path": "proj/.hidden.cfg", "line": 1, "text": "NEEDLE hidden but not ignored"},
            {"path": "proj/src/main.py", "line": 1, "text": "# NEEDLE in the source"},
        ],
        "truncated": False,
    }
    # A glob relative to `path` still applies, and an explicitly named ignored file is searched.
    result, _ = tool_call(peer, "g2", "fs.search", {"pattern": "NEEDLE", "path": "proj", "glob": "src/*.py"})
    assert [m["path"] for m in result["matches"]] == ["proj/src/main.py"]  # type: ignore[index]
    result, _ = tool_call(peer, "g3", "fs.search", {"pattern": "NEEDLE", "path": "proj/build/out.txt"})
    assert [m["path"] for m in result["matches"]] == ["proj/build/out.txt"]  # type: ignore[index]


@pytest.fixture
def huge_line(server: ServerProcess) -> pathlib.Path:
    """A 200 MB file that is one line, with a match near its end."""
    path = server.root / "huge" / "one-line.min.js"
    if path.exists():
        return path
    path.parent.mkdir()
    block = b"x" * (1 << 20)
    with path.open("wb") as f:
        for _ in range(BIG // len(block) - 1):
            f.write(block)
        f.write(b"y" * ((1 << 20) - 100) + b"NEEDLE" + b"z" * 93 + b"\n")
    return path


def test_a_huge_single_line_is_cut_not_read(server: ServerProcess, huge_line: pathlib.Path) -> None:
    peer = session(server)
    before = rss_kib(server.pid, "VmRSS")
    for i in range(4):
        result, envs = tool_call(peer, f"h{i}", "fs.search", {"pattern": "NEEDLE", "path": "huge"})
        assert not errors(envs), errors(envs)
        assert result is not None
        (match,) = result["matches"]
        assert match["path"] == "huge/one-line.min.js" and match["line"] == 1
        assert "NEEDLE" in match["text"] and len(match["text"]) == MAX_LINE_CHARS
    # The re-based tool read the line whole each time (RSS reached 2.1 GB); now the service holds
    # an excerpt. The bound is a quarter of one copy of the line.
    assert rss_kib(server.pid, "VmHWM") - before < BIG // 4 // 1024
    assert rss_kib(server.pid, "VmRSS") - before < BIG // 4 // 1024


def test_a_timed_out_search_kills_rg(server: ServerProcess, huge_line: pathlib.Path) -> None:
    peer = session(server)
    # Case-insensitive Unicode matching over 200 MB is slow enough to outlast 1 ms everywhere.
    _, envs = tool_call(peer, "t", "fs.search", {"pattern": r"\w+NEEDLE\w*q", "path": "huge", "ignore_case": True}, timeout_ms=1)
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_EXECUTION_TIMEOUT
    assert wait_until(lambda: not [p for p, state in descendants(server.pid) if state != "Z"], timeout=10)
    # The service goes on.
    listed, _ = tool_call(peer, "l", "tools.list", {})
    assert listed is not None
