"""The file tools' workspace is enforced by the kernel: a racer swapping a path
component for a symlink to outside never gets a tool out, ``/proc`` cannot be probed, appending to a
hard link of an outside file is refused, symlinks that stay inside keep working. Every case runs
with ``openat2`` and with the ``O_NOFOLLOW`` component walk that replaces it where the kernel lacks
it (``SMITH_FAST_NO_OPENAT2=1`` for a server, :func:`set_openat2` in-process)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.tools import openat2
from smith_fast.tools.openat2 import open_beneath, set_openat2
from smith_fast.tools import default_registry
from smith_fast.tools.workspace import ToolContext

from .peers import V1Peer, errors, kind, terminal
from .server import ServerProcess, assert_clean_log

MODES = ["openat2", "walk"]
IN_PROCESS_CALLS = 12_000
SERVER_CALLS = 1_500


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    set_openat2(request.param == "openat2")
    assert openat2.kernel_openat2() == (request.param == "openat2")
    yield request.param
    set_openat2(True)


def layout(tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A workspace and an outside directory that mirrors its ``d/`` with a marker in each file."""
    root, outside = tmp / "ws", tmp / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (root / "d" / "f").write_text("inside\n")
    (outside / "f").write_text("OUTSIDE\n")
    (outside / "only-outside").write_text("x")
    (root / "rel-in").symlink_to("d/f")
    (root / "abs-in").symlink_to(root / "d" / "f")
    (root / "dir-in").symlink_to("d", target_is_directory=True)
    (root / "out").symlink_to(outside, target_is_directory=True)
    (root / "proc-root").symlink_to("/proc/self/root", target_is_directory=True)
    return root, outside


# The racer: a separate process (real parallelism, not a thread behind our GIL) that keeps
# swapping ws/d for a symlink to outside and back.
RACER = r"""
import os, shutil, sys
root, outside = sys.argv[1], sys.argv[2]
d, aside = os.path.join(root, "d"), os.path.join(root, "d.aside")
print("go", flush=True)
while True:
    try:
        os.rename(d, aside)
        os.symlink(outside, d)
        os.unlink(d)
        os.rename(aside, d)
    except OSError:
        # fs.write with create_dirs made a new d while it was away: drop it, put the real one back
        try:
            if os.path.isdir(aside) and not os.path.islink(d):
                shutil.rmtree(d, ignore_errors=True)
            if os.path.islink(d):
                os.unlink(d)
            if os.path.isdir(aside) and not os.path.lexists(d):
                os.rename(aside, d)
        except OSError:
            pass
"""


class Racer:
    def __init__(self, root: pathlib.Path, outside: pathlib.Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RACER, str(root), str(outside)], stdout=subprocess.PIPE)
        assert self.proc.stdout and self.proc.stdout.readline() == b"go\n"

    def stop(self, root: pathlib.Path) -> None:
        assert self.proc.poll() is None, "the racer died: the race did not run"
        self.proc.kill()
        self.proc.wait()
        d, aside = root / "d", root / "d.aside"
        if d.is_symlink():
            d.unlink()
        if aside.exists():
            if d.exists():  # made by fs.write's create_dirs while the real one was aside
                shutil.rmtree(d)
            aside.rename(d)


def outside_changed(outside: pathlib.Path) -> list[str]:
    found = sorted(p.name for p in outside.iterdir())
    changed = [name for name in found if name not in ("f", "only-outside")]
    if (outside / "f").read_text() != "OUTSIDE\n":
        changed.append("f (modified)")
    return changed


def escaped(tool: str, result: dict[str, Any]) -> bool:
    if tool == "fs.read":
        return "OUTSIDE" in result["content"]
    if tool == "fs.list":
        return any(e["name"] == "only-outside" for e in result["entries"])
    if tool == "fs.search":
        return any("OUTSIDE" in m["text"] for m in result["matches"])
    return False  # fs.write: judged by what appeared outside


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("fs.read", {"path": "d/f"}),
    ("fs.list", {"path": "d"}),
    ("fs.write", {"path": "d/w", "content": "x"}),
    ("fs.write", {"path": "d/f", "content": "y\n", "append": True}),
    ("fs.read", {"path": "dir-in/f"}),
    ("fs.write", {"path": "dir-in/new/deep.txt", "content": "z", "create_dirs": True}),
]
SEARCHES = 400  # each starts an rg: fewer, in a test of their own


def test_racing_symlink_swaps_never_escape_in_process(tmp_path: pathlib.Path, mode: str) -> None:
    root, outside = layout(tmp_path)
    ctx = ToolContext(root)
    registry = default_registry(entry_points=False)
    outcomes = {"ok": 0, "refused": 0, "failed": 0}
    escapes: list[str] = []

    async def run() -> None:
        for i in range(IN_PROCESS_CALLS):
            tool, args = CALLS[i % len(CALLS)]
            try:
                out = await registry.call(tool, json.dumps(args).encode(), ctx)
            except ProtocolError as exc:  # the workspace refusal: d was a symlink to outside
                assert exc.code == pb.ERROR_CODE_PERMISSION_DENIED
                outcomes["refused"] += 1
                continue
            if out.success:
                outcomes["ok"] += 1
                if escaped(tool, json.loads(out.result)):
                    escapes.append(f"{tool} {args}")
            else:
                outcomes["failed"] += 1

    racer = Racer(root, outside)
    try:
        asyncio.run(run())
    finally:
        racer.stop(root)
    assert escapes == [] and outside_changed(outside) == []
    # The race was real: calls both succeeded and failed (a vanished or refused component).
    assert outcomes["ok"] > 0 and outcomes["failed"] + outcomes["refused"] > 0, outcomes
    assert sum(outcomes.values()) == IN_PROCESS_CALLS


def test_racing_symlink_swaps_never_lead_fs_search_outside(tmp_path: pathlib.Path) -> None:
    # rg walks by path: what keeps it inside is the Landlock domain sandbox-exec --only-read gives it.
    root, outside = layout(tmp_path)
    (root / "out").unlink()
    (root / "proc-root").unlink()
    ctx = ToolContext(root)
    registry = default_registry(entry_points=False)
    escapes: list[str] = []
    found = 0

    async def run() -> None:
        nonlocal found
        calls = [registry.call("fs.search", b'{"pattern": "OUTSIDE|inside"}', ctx) for _ in range(SEARCHES)]
        for out in await asyncio.gather(*calls):
            assert out.success, out.error
            matches = json.loads(out.result)["matches"]
            found += bool(matches)
            escapes.extend(m["path"] for m in matches if "OUTSIDE" in m["text"])

    racer = Racer(root, outside)
    try:
        asyncio.run(run())
    finally:
        racer.stop(root)
    assert escapes == [] and found > 0


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"confined-{request.param}")
    root, _ = layout(tmp)
    env = {"SMITH_FAST_NO_OPENAT2": "1"} if request.param == "walk" else {"SMITH_FAST_NO_OPENAT2": "0"}
    srv = ServerProcess(tmp, root=root, env=env).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


def call(peer: V1Peer, rid: str, tool: str, args: dict[str, Any]) -> tuple[pb.ToolResultEvent | None, list[pb.ErrorEvent]]:
    peer.command(tool_call=pb.ToolCallCommand(request_id=rid, tool=tool, args=json.dumps(args).encode()))
    envs = peer.until(terminal(rid))
    results = [e.event.tool_result for e in envs if kind(e) == "tool_result"]
    return (results[0] if results else None), errors(envs)


def session(server: ServerProcess) -> V1Peer:
    peer = V1Peer(server.unix, timeout=60)
    peer.handshake(caps=())
    return peer


def assert_refused(peer: V1Peer, tool: str, args: dict[str, Any]) -> None:
    result, errs = call(peer, "r", tool, args)
    assert result is None, (tool, args, result)
    (err,) = errs
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "outside the workspace root" in err.message, err
    assert "Errno" not in err.message and "PermissionError" not in err.message


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("fs.read", {"path": "/proc/1/root/etc/hostname"}),
        ("fs.read", {"path": "/proc/self/root/etc/hostname"}),
        ("fs.read", {"path": "/proc/1/root/no/such/file"}),
        ("fs.read", {"path": "proc-root/etc/hostname"}),
        ("fs.list", {"path": "/proc/1/root"}),
        ("fs.list", {"path": "proc-root"}),
        ("fs.write", {"path": "/proc/1/root/tmp/planted", "content": "x"}),
        ("fs.write", {"path": "proc-root/tmp/planted", "content": "x"}),
        ("fs.search", {"pattern": "x", "path": "/proc/1/root/etc"}),
        ("fs.read", {"path": "out/f"}),
        ("fs.write", {"path": "out/planted", "content": "x", "create_dirs": True}),
        ("fs.list", {"path": "out"}),
    ],
)
def test_proc_and_symlinks_out_get_the_workspace_refusal(server: ServerProcess, tool: str, args: dict[str, Any]) -> None:
    peer = session(server)
    assert_refused(peer, tool, args)
    assert outside_changed(server.root.parent / "outside") == []


def test_symlinks_that_stay_inside_keep_working(server: ServerProcess) -> None:
    peer = session(server)
    for path in ("rel-in", "abs-in", "dir-in/f", str(server.root / "d" / "f"), "d/../d/f"):
        result, errs = call(peer, "i", "fs.read", {"path": path})
        assert not errs and result is not None and result.success, (path, errs)
        got = json.loads(result.result)
        assert (got["path"], got["content"]) == ("d/f", "inside\n"), path
    result, errs = call(peer, "l", "fs.list", {"path": "dir-in"})
    assert not errs and result is not None
    assert [e["path"] for e in json.loads(result.result)["entries"]][:1] == ["d/f"]
    # Writing through a symlink inside writes the file it names, and keeps the link.
    (server.root / "write-link").unlink(missing_ok=True)
    (server.root / "write-link").symlink_to("d/written.txt")
    result, errs = call(peer, "w", "fs.write", {"path": "write-link", "content": "via link"})
    assert not errs and result is not None and json.loads(result.result)["path"] == "d/written.txt"
    assert (server.root / "d" / "written.txt").read_text() == "via link" and (server.root / "write-link").is_symlink()


def test_appending_to_a_hard_link_is_refused(server: ServerProcess) -> None:
    outside = server.root.parent / "outside"
    target = outside / "bashrc"
    target.write_text("original\n")
    link = server.root / "hard"
    link.unlink(missing_ok=True)
    os.link(target, link)
    try:
        peer = session(server)
        result, errs = call(peer, "a", "fs.write", {"path": "hard", "content": "pwned\n", "append": True})
        assert result is None
        (err,) = errs
        assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "hard links" in err.message
        assert target.read_text() == "original\n"
        # A replacing write renames a new file over the name: the other name keeps its content.
        result, errs = call(peer, "b", "fs.write", {"path": "hard", "content": "new\n"})
        assert not errs and result is not None and result.success
        assert link.read_text() == "new\n" and target.read_text() == "original\n"
        # Now a file of its own: appending works.
        result, errs = call(peer, "c", "fs.write", {"path": "hard", "content": "more\n", "append": True})
        assert not errs and result is not None and result.success and link.read_text() == "new\nmore\n"
    finally:
        target.unlink()


def test_racing_symlink_swaps_never_escape_through_the_server(server: ServerProcess) -> None:
    root, outside = server.root, server.root.parent / "outside"
    peer = session(server)
    racer = Racer(root, outside)
    escapes: list[str] = []
    answered = refused = 0
    try:
        window = 32  # pipelined, so the service is busy while the racer runs
        for start in range(0, SERVER_CALLS, window):
            batch = range(start, min(start + window, SERVER_CALLS))
            for i in batch:
                tool, args = CALLS[i % len(CALLS)]
                peer.command(tool_call=pb.ToolCallCommand(request_id=f"c{i}", tool=tool, args=json.dumps(args).encode()))
            pending = {f"c{i}": CALLS[i % len(CALLS)][0] for i in batch}
            while pending:  # answers come in any order
                env = peer.recv()
                if kind(env) == "error" or (kind(env) == "tool_result" and not env.event.tool_result.success):
                    refused += 1
                if kind(env) == "tool_result" and env.event.tool_result.success:
                    res = env.event.tool_result
                    if escaped(pending[res.request_id], json.loads(res.result)):
                        escapes.append(res.request_id)
                sc = env.event.state_change
                if kind(env) == "state_change" and sc.request_id in pending and sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                    del pending[sc.request_id]
                    answered += 1
    finally:
        racer.stop(root)
    assert answered == SERVER_CALLS
    assert escapes == [] and outside_changed(outside) == []
    assert 0 < refused < SERVER_CALLS  # the race was real: some calls met the symlink, some not


def test_open_beneath_refuses_what_the_kernel_refuses(tmp_path: pathlib.Path, mode: str) -> None:
    root, _ = layout(tmp_path)
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        ok = open_beneath(fd, "d/../rel-in", os.O_RDONLY)
        assert os.read(ok, 100) == b"inside\n"
        os.close(ok)
        for path, code in [("../outside/f", "EXDEV"), ("out/f", "EXDEV"), ("abs-in", "EXDEV"), ("/etc/hostname", "EXDEV"),
                           ("proc-root/etc", "EXDEV"), ("d/f/x", "ENOTDIR"), ("nope", "ENOENT")]:
            with pytest.raises(OSError) as info:
                os.close(open_beneath(fd, path, os.O_RDONLY))
            assert info.value.errno == getattr(errno, code), (path, info.value)
        with pytest.raises(OSError) as info:
            open_beneath(fd, "rel-in", os.O_RDONLY, follow=False)
        assert info.value.errno == errno.ELOOP
    finally:
        os.close(fd)


def test_the_compiled_openat2_is_the_ctypes_call(tmp_path: pathlib.Path) -> None:
    """csrc/_openat2_c.pyx and the ctypes fallback: the same file opened, or the same errno."""
    from smith_fast import _openat2_c

    root, _ = layout(tmp_path)
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    beneath = openat2.RESOLVE_BENEATH | openat2.RESOLVE_NO_MAGICLINKS
    try:
        cases = [(p, os.O_RDONLY | os.O_CLOEXEC, 0, r) for p in ("d/../rel-in", "rel-in", "../outside/f", "out/f", "abs-in",
                 "/etc/hostname", "proc-root/etc", "d/f/x", "nope", "d", ".")
                 for r in (beneath, beneath | openat2.RESOLVE_NO_SYMLINKS)]
        cases.append(("made", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640, beneath))
        cases.append(("made", os.O_RDONLY, 0o640, beneath))  # a mode without O_CREAT: EINVAL from both
        for path, flags, mode, resolve in cases:
            got = [call(fd, path.encode(), flags, mode, resolve) for call in (_openat2_c.openat2, openat2._ctypes_openat2)]
            if got[0] >= 0:
                assert got[1] >= 0, (path, got)
                assert os.path.samestat(os.fstat(got[0]), os.fstat(got[1])), path
                for opened in got:
                    os.close(opened)
            else:
                assert got[0] == got[1], (path, got)
        assert stat.S_IMODE(os.stat(root / "made").st_mode) == 0o640 & ~_umask()
        with pytest.raises(ValueError, match="embedded null byte"):
            _openat2_c.openat2(fd, b"rel\0in", os.O_RDONLY, 0, beneath)
    finally:
        os.close(fd)


def test_the_compiled_fstat_is_os_fstat(tmp_path: pathlib.Path) -> None:
    """csrc/_openat2_c.pyx's mode_and_size and the os.fstat fallback: the same mode and size of a
    file, an empty one, a directory and a pipe, and the same errno for a closed fd."""
    from smith_fast import _openat2_c

    (tmp_path / "f").write_bytes(b"x" * 4099)
    (tmp_path / "empty").write_bytes(b"")
    fds = [os.open(tmp_path / "f", os.O_RDONLY), os.open(tmp_path / "empty", os.O_RDONLY),
           os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), *os.pipe()]
    try:
        for fd in fds:
            got = [call(fd) for call in (_openat2_c.mode_and_size, openat2._os_mode_and_size)]
            assert got[0] == got[1] == (os.fstat(fd).st_mode, os.fstat(fd).st_size), fd
        assert _openat2_c.mode_and_size(fds[0]) == (os.stat(tmp_path / "f").st_mode, 4099)
    finally:
        for fd in fds:
            os.close(fd)
    for call in (_openat2_c.mode_and_size, openat2._os_mode_and_size):
        with pytest.raises(OSError) as info:
            call(fds[0])
        assert info.value.errno == errno.EBADF


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
