"""A workspace per session (``serve --workspaces``), end to end against real services: sessions from
templates, isolation between them (as attacks), checkpoint → change → restore byte-exact, 50 forks
of one checkpoint, diff, what each request changed and Undo, and the bounds.

The workspaces, templates and victims live under /var/tmp: a command's /tmp is a private tmpfs, so
anything under the host's /tmp would be out of its view by accident and an attack on it would
prove nothing.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from smith_fast.client import Client
from smith_fast.errors import SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, wait_until

T = TypeVar("T")
CAPS = ["shell_exec", "workspaces"]


def arun(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, pathlib.Path]]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-ws-", dir="/var/tmp"))
    out = {name: base / name for name in ("root", "py", "big", "ws", "srv")}
    for path in out.values():
        path.mkdir()
    (out["py"] / "main.py").write_text("print('template')\n")
    (out["py"] / "pkg").mkdir()
    (out["py"] / "pkg" / "mod.py").write_text("x = 1\n")
    (out["big"] / "big.txt").write_text("big\n")
    (out["root"] / "README").write_text("root template\n")
    yield out
    shutil.rmtree(base, ignore_errors=True)


def start(places: dict[str, pathlib.Path], *extra: str, ws: pathlib.Path | None = None) -> ServerProcess:
    tmp = places["srv"] / uuid.uuid4().hex[:8]
    tmp.mkdir(parents=True)
    return ServerProcess(
        tmp, "--workspaces", str(ws or places["ws"]), "--template", f"py={places['py']}",
        "--template", f"big={places['big']}", "--kill-grace", "0.5s", *extra, root=places["root"], tcp=False, log_level="info",
    ).start()


@pytest.fixture(scope="module")
def server(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    (places["srv"]).mkdir(exist_ok=True)
    srv = start(places, "--max-workspace-bytes", "64M")
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def session(srv: ServerProcess, template: str | None = None, fork: str | None = None, accept: tuple[str, ...] = (),
                  resume: bool = False) -> tuple[Client, pb.ReadyEvent]:
    client = await Client.connect(srv.unix, resume=resume)
    info = {"client": "test"}
    if template:
        info["smith_fast.template"] = template
    if fork:
        info["smith_fast.fork"] = fork
    ready = await client.handshake(CAPS, client_info=info, accept=accept)
    return client, ready


async def sh(client: Client, command: str, rid: str | None = None) -> tuple[int, str, str, pb.ShellOutputEvent | None]:
    """Run ``command``: its exit code, stdout, stderr and its final ShellOutputEvent."""
    out, err, final, code = [], [], None, -1
    async for event in client.shell_exec(command, request_id=rid):
        if event.WhichOneof("event_type") == "shell_output":
            so = event.shell_output
            out.append(so.stdout)
            err.append(so.stderr)
            if so.finished:
                final, code = so, so.exit_code
    return code, "".join(out), "".join(err), final


def changes_of(final: Any) -> dict[str, tuple[str, int]]:
    kinds = {pb.CHANGE_KIND_ADDED: "added", pb.CHANGE_KIND_MODIFIED: "modified", pb.CHANGE_KIND_DELETED: "deleted"}
    return {c.path: (kinds[c.kind], c.size) for c in final.changes.changes}


# ---- a workspace per session ------------------------------------------------------------------


def test_each_session_writes_its_own_copy_of_the_template(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async def main() -> str:
        a, ready_a = await session(server, "py")
        b, ready_b = await session(server, "py")
        info_a, info_b = ready_a.service_info, ready_b.service_info
        assert info_a["smith_fast.template"] == info_b["smith_fast.template"] == "py"
        assert info_a["smith_fast.workspace"] != info_b["smith_fast.workspace"]
        assert "workspaces" in info_a["granted_capabilities"]
        for client, text in ((a, "from a"), (b, "from b")):
            assert (await sh(client, f"echo '{text}' > f.txt; echo x >> main.py"))[0] == 0
        assert (await sh(a, "cat f.txt; cat main.py"))[1] == "from a\nprint('template')\nx\n"
        assert (await sh(b, "cat f.txt"))[1] == "from b\n"
        read = await a.call_tool("fs.read", {"path": "f.txt"})
        assert read.success and b"from a" in read.result
        found = await a.call_tool("fs.search", {"pattern": "from [ab]"})  # rg, confined beneath the workspace
        assert found.success and b"f.txt" in found.result and b"from a" in found.result and b"from b" not in found.result
        ran = await b.call_tool("shell.run", {"command": "cat f.txt"})
        assert ran.success and b"from b" in ran.result
        assert (places["py"] / "main.py").read_text() == "print('template')\n"  # the template is untouched
        assert not (places["py"] / "f.txt").exists()
        _, default = await session(server)
        assert default.service_info["smith_fast.template"] == "py"  # the first --template is the default
        await a.close()
        await b.close()
        return info_a["smith_fast.workspace"]

    workspace = arun(main())
    # the audit line of each request names the workspace it ran in
    assert wait_until(lambda: any(r.get("event") == "request" and r.get("workspace") == workspace and r.get("kind") == "tool_call"
                                  for r in server.logs), 5)


def test_an_unknown_template_is_refused_and_the_connection_stays(server: ServerProcess) -> None:
    async def main() -> None:
        client = await Client.connect(server.unix)
        with pytest.raises(SmithError) as caught:
            await client.handshake(CAPS, client_info={"smith_fast.template": "nope"})
        assert caught.value.details.get("reason") == "unknown_template"
        ready = await client.handshake(CAPS, client_info={"smith_fast.template": "big"})
        assert ready.service_info["smith_fast.template"] == "big"
        assert (await sh(client, "cat big.txt"))[1] == "big\n"
        await client.close()

    arun(main())


# ---- isolation between sessions (attacks) --------------------------------------------------------


def test_a_session_cannot_reach_another_sessions_workspace_or_the_templates(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async def main() -> None:
        victim, ready_v = await session(server, "py")
        assert (await sh(victim, "echo secret-of-b > secret"))[0] == 0
        b_root = ready_v.service_info["smith_fast.workspace_root"]
        attacker, ready_a = await session(server, "py")
        a_root = ready_a.service_info["smith_fast.workspace_root"]
        ws = str(places["ws"])
        attempts = [
            f"cat {b_root}/secret",
            f"cat ../../{os.path.basename(os.path.dirname(b_root))}/root/secret",
            f"ls {ws}/s | grep -v -x {os.path.basename(os.path.dirname(a_root))}",
            "cat /proc/*/root" + b_root + "/secret",
            f"ln {b_root}/secret stolen && cat stolen",
            f"cat {places['py']}/main.py",
            f"echo pwned > {places['py']}/main.py",
            f"unshare -Urm sh -c 'umount {ws} 2>/dev/null || umount -l {ws}; cat {b_root}/secret'",
            f"mount --bind {b_root} x 2>/dev/null && cat x/secret",
            "find / -name secret -path '*root*' 2>/dev/null | xargs cat 2>/dev/null",
        ]
        for attempt in attempts:
            code, out, err, _ = await sh(attacker, attempt)
            assert "secret-of-b" not in out + err, attempt
            assert "print('template')" not in out or "main.py" not in attempt, attempt
        # the file tools: a symlink to the other workspace, and a path leaving the root
        assert (await sh(attacker, f"ln -s {b_root}/secret link"))[0] == 0
        for path in ("link", f"{b_root}/secret", "../../../" + b_root + "/secret", f"{places['py']}/main.py"):
            try:
                result = await attacker.call_tool("fs.read", {"path": path})
            except SmithError as exc:
                assert "secret-of-b" not in str(exc)
            else:
                assert not result.success or b"secret-of-b" not in result.result
        try:
            wrote = await attacker.call_tool("fs.write", {"path": "link", "content": "overwritten"})
        except SmithError:
            pass
        else:
            assert not wrote.success
        assert (await sh(victim, "cat secret"))[1] == "secret-of-b\n"
        assert (places["py"] / "main.py").read_text() == "print('template')\n"
        await attacker.close()
        await victim.close()

    arun(main())


# ---- checkpoint, restore, fork, diff -------------------------------------------------------------

TREE = """
mkdir -p d/empty d/sub keep gone && echo one > d/sub/a.txt && printf 'bin\\000ary' > d/bin &&
ln -s sub/a.txt d/rel && ln -s /etc/hostname d/abs && ln -s nowhere d/dangling &&
echo linked > h1 && ln h1 h2 && chmod 600 h1 && chmod 2755 keep && echo bye > gone/f && echo doomed > doomed &&
touch -d '2001-02-03 04:05:06.123456789' d/sub/a.txt
"""
CHANGE = """
rm -rf gone doomed d/empty && echo two >> d/sub/a.txt && chmod 644 h1 && echo new > new.txt && mkdir -p made/deep &&
ln -sf elsewhere d/rel && rm h2 && echo other > h2 && mv main.py moved.py
"""
SNAPSHOT = r"""
find . -mindepth 1 | LC_ALL=C sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p L $(readlink "$p")";
  elif [ -d "$p" ]; then echo "$p D $(stat -c %a "$p")";
  else echo "$p F $(stat -c '%a %s %h %Y' "$p") $(sha256sum < "$p" | cut -c1-16)"; fi
done; stat -c %i h1 h2 | uniq | wc -l
"""


def test_checkpoint_change_restore_is_byte_exact(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py")
        assert (await sh(client, TREE))[0] == 0
        before = (await sh(client, SNAPSHOT))[1]
        checkpoint = await client.checkpoint()
        assert (await sh(client, CHANGE))[0] == 0, (await sh(client, CHANGE))[2]
        assert (await sh(client, SNAPSHOT))[1] != before
        await client.restore(checkpoint)
        assert (await sh(client, SNAPSHOT))[1] == before
        # and again, after more changes: a checkpoint stays valid whatever came after it
        assert (await sh(client, "echo later > later.txt"))[0] == 0
        later = await client.checkpoint()
        await client.restore(checkpoint)
        assert (await sh(client, "test -e later.txt; echo $?"))[1] == "1\n"
        await client.restore(later)
        assert (await sh(client, "cat later.txt"))[1] == "later\n"
        await client.close()

    arun(main())


def test_a_sessions_commands_are_forked_in_its_sandbox_built_once(server: ServerProcess) -> None:
    # As without --workspaces: the session's sandbox is built at its first command and its commands
    # are forked in it (sandbox/zygote.py), one pid namespace, so each command's $$ is a new pid (a
    # sandbox of its own made every command pid 2, at 4x the time). A request's writes becoming a
    # layer of their own mount the root again: the sandbox is built again on it, and the next
    # command sees what the last one wrote.
    async def main() -> None:
        client, _ = await session(server, "py", accept=("changes",))
        pids = [(await sh(client, "echo $$"))[1] for _ in range(4)]
        assert len(set(pids)) == 4, pids
        for n in range(3):
            assert (await sh(client, f"echo {n} > n{n}.txt"))[0] == 0
            assert (await sh(client, f"cat n{n}.txt; echo $$"))[1].startswith(f"{n}\n")
        assert (await sh(client, "cat n0.txt n1.txt n2.txt"))[1] == "0\n1\n2\n"
        await client.close()

    arun(main())


def test_a_workspace_sessions_commands_are_bounded_as_any(places: dict[str, pathlib.Path]) -> None:
    # The service enters a user namespace of its own for the workspaces, where host root's uid no
    # longer overrides permissions. Where its cgroup is a hierarchy's root (0555, as in many
    # containers and on this machine kind) it could not make its cells' parents there, and its
    # commands ran with the v1 memory limit alone: no pids.max (64 processes ran under
    # --max-pids-per-command 32), no cgroup.kill, no CPU accounting. They are made before it enters
    # (as a service without --workspaces makes them), and the child guard removes them at the end.
    tmp = places["srv"] / uuid.uuid4().hex[:8]
    tmp.mkdir(parents=True)
    ws = ServerProcess(tmp, "--workspaces", str(tmp / "ws"), "--max-pids-per-command", "32", root=places["root"],
                       tcp=False, log_level="debug").start()
    (tmp / "plain").mkdir()
    plain = ServerProcess(tmp / "plain", root=places["root"], tcp=False, log_level="debug").start()
    try:
        def containment(srv: ServerProcess) -> dict[str, Any]:
            (record,) = [r for r in srv.logs if r.get("event") == "command containment"]
            return record

        plain_has, ws_has = containment(plain), containment(ws)
        assert (ws_has["controllers"], ws_has["kill"]) == (plain_has["controllers"], plain_has["kill"]), (ws_has, plain_has)

        async def main() -> None:
            client, _ = await session(ws)
            with pytest.raises(SmithError) as caught:
                await client.run("for i in $(seq 64); do sleep 30 & done; wait")
            assert "RESOURCE_EXHAUSTED" in str(caught.value) and "--max-pids-per-command" in str(caught.value)
            assert (await sh(client, "echo alive"))[1] == "alive\n"
            await client.close()

        arun(main())
    finally:
        assert ws.stop() == 0, "\n".join(ws.raw_stderr[-30:])
        assert plain.stop() == 0
    assert wait_until(lambda: not any(os.path.exists(p) for p in ws_has["cgroups"]), 5), ws_has["cgroups"]


def test_restore_cancels_what_runs_with_reason_restored(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py")
        checkpoint = await client.checkpoint()
        proc = await client.start("while true; do echo x >> grows; sleep 0.05; done")
        assert await wait_async(lambda: sh(client, "test -s grows && echo yes"), "yes\n")
        cancelled = await client.restore(checkpoint)
        assert proc.request_id in cancelled
        with pytest.raises(SmithError) as caught:
            await proc.wait()
        assert caught.value.details.get("reason") == "restored"
        assert (await sh(client, "test -e grows; echo $?"))[1] == "1\n"
        await client.close()

    arun(main())


async def wait_async(probe: Callable[[], Awaitable[tuple[int, str, str, Any]]], want: str, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if (await probe())[1] == want:
            return True
        await asyncio.sleep(0.05)
    return False


def test_a_checkpoint_is_refused_while_another_request_runs(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py")
        proc = await client.start("sleep 30")
        with pytest.raises(SmithError) as caught:
            await client.checkpoint()
        assert caught.value.details.get("reason") == "workspace_busy"
        assert proc.request_id in caught.value.details.get("running", "")
        proc.cancel()
        with pytest.raises(SmithError):
            await proc.wait()
        assert await client.checkpoint()
        await client.close()

    arun(main())


def test_fifty_forks_of_one_checkpoint_see_only_their_own_writes(server: ServerProcess) -> None:
    async def main() -> None:
        origin, _ = await session(server, "py")
        assert (await sh(origin, "echo base > base.txt"))[0] == 0
        checkpoint = await origin.checkpoint()

        async def attempt(i: int) -> str:
            client, ready = await session(server, fork=checkpoint)
            assert ready.service_info["smith_fast.template"] == "py"
            code, out, err, _ = await sh(client, f"echo mine-{i} > mine.txt; cat base.txt; ls; cat mine.txt")
            await client.close()
            assert code == 0, err
            return out

        outs = await asyncio.gather(*(attempt(i) for i in range(50)))
        for i, out in enumerate(outs):
            assert out.count("mine-") == 1 and f"mine-{i}\n" in out and out.startswith("base\n"), out
        assert (await sh(origin, "test -e mine.txt; echo $?"))[1] == "1\n"
        await origin.close()

    arun(main())


def test_diff_names_what_was_added_modified_and_deleted(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py")
        assert (await sh(client, "echo keep > keep.txt; echo old > change.txt; echo bye > gone.txt; seq 1 200000 > big.txt"))[0] == 0
        first = await client.checkpoint()
        assert (await sh(client, "echo new > new.txt; echo changed > change.txt; rm gone.txt; seq 2 200001 > big.txt"))[0] == 0
        second = await client.checkpoint()
        changes = {c.path: c for c in await client.diff(first, second)}
        assert {p: c.kind for p, c in changes.items()} == {"new.txt": "added", "change.txt": "modified", "gone.txt": "deleted",
                                                             "big.txt": "modified"}
        assert changes["new.txt"].size == 4 and changes["gone.txt"].old_size == 4
        assert "-old\n+changed" in changes["change.txt"].unified_diff
        live = {c.path: c.kind for c in await client.diff(first)}  # to the workspace now
        assert live == {p: c.kind for p, c in changes.items()}
        small = await client.diff(first, second, max_diff_bytes=100)
        assert all(len(c.unified_diff) <= 100 for c in small)
        await client.close()

    arun(main())


# ---- what a request changed; Undo ----------------------------------------------------------------


def test_each_command_reports_what_it_changed_and_can_be_undone(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py", accept=("changes",))
        assert (await sh(client, "echo b > b; echo c > c"))[0] == 0
        rid = str(uuid.uuid4())
        code, _, _, final = await sh(client, "touch a; echo x >> b; rm c; mkdir d; ln -s a e", rid=rid)
        assert code == 0 and final is not None
        assert changes_of(final) == {"a": ("added", 0), "b": ("modified", 4), "c": ("deleted", 0), "d": ("added", final.changes.changes[3].size),
                                     "e": ("added", 1)}
        assert final.changes.exact
        written = await client.call_tool("fs.write", {"path": "w.txt", "content": "hello"})
        assert written.success and [(c.path, c.kind) for c in written.changes.changes] == [("w.txt", pb.CHANGE_KIND_ADDED)]
        undone = await client.undo(rid)
        assert sorted(undone.conflicts) == []
        assert (await sh(client, "ls; cat b"))[1] == "b\nc\nmain.py\npkg\nw.txt\nb\n"
        # a later request touched the same path: left alone unless forced
        r1 = str(uuid.uuid4())
        assert (await sh(client, "echo one > shared", rid=r1))[0] == 0
        assert (await sh(client, "echo two >> shared"))[0] == 0
        result = await client.undo(r1)
        assert result.conflicts == ["shared"]
        assert (await sh(client, "cat shared"))[1] == "one\ntwo\n"
        forced = await client.undo(r1, force=True)
        assert forced.conflicts == ["shared"]
        assert (await sh(client, "test -e shared; echo $?"))[1] == "1\n"
        await client.close()

    arun(main())


def test_two_commands_at_once_share_a_layer(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py", accept=("changes",))
        go = "go-" + uuid.uuid4().hex
        first = asyncio.ensure_future(sh(client, f"echo 1 > one; while [ ! -e {go} ]; do sleep 0.02; done"))
        await asyncio.sleep(0.3)
        second = await sh(client, f"echo 2 > two; touch {go}")
        done = await first
        assert second[3] is not None and done[3] is not None
        assert not second[3].changes.exact and not done[3].changes.exact
        with pytest.raises(SmithError) as caught:
            await client.undo(str(uuid.uuid4()))
        assert caught.value.details.get("reason") == "unknown_request"
        await client.close()

    arun(main())


# ---- bounds --------------------------------------------------------------------------------------


def test_writing_past_the_bound_is_enospc_and_touches_nobody_else(server: ServerProcess) -> None:
    async def main() -> None:
        client, _ = await session(server, "py")
        other, _ = await session(server, "py")
        code, _, err, _ = await sh(client, "dd if=/dev/zero of=fill bs=1M count=100")
        assert code != 0 and "No space left on device" in err
        assert (await sh(other, "dd if=/dev/zero of=fine bs=1M count=8 2>/dev/null; wc -c < fine"))[1] == "8388608\n"
        assert (await sh(client, "rm fill; echo ok > after"))[0] == 0
        await client.close()
        await other.close()

    arun(main())


def test_max_workspaces_and_what_a_killed_service_leaves(places: dict[str, pathlib.Path]) -> None:
    ws = places["ws"].parent / "ws-bounds"
    srv = start(places, "--max-workspaces", "2", "--warm-workspaces", "0", ws=ws)

    async def main() -> None:
        a, _ = await session(srv)
        b, _ = await session(srv)
        client = await Client.connect(srv.unix)
        with pytest.raises(SmithError) as caught:
            await client.handshake(CAPS)
        assert caught.value.details.get("reason") == "max_workspaces"
        await a.close()
        assert wait_until(lambda: len(os.listdir(ws / "s")) == 1, 5)
        await client.close()
        await b.close()

    try:
        arun(main())
    finally:
        srv.stop(signal.SIGKILL)
    again = start(places, "--warm-workspaces", "0", ws=ws)
    try:
        assert os.listdir(ws / "s") == []  # what the killed service left is gone
    finally:
        assert again.stop() == 0


def test_a_resumed_session_finds_its_workspace(places: dict[str, pathlib.Path]) -> None:
    ws = places["ws"].parent / "ws-resume"
    srv = start(places, "--resume-window", "1s", ws=ws)

    async def main() -> None:
        client, ready = await session(srv, "py", resume=True)
        workspace = ready.service_info["smith_fast.workspace"]
        assert (await sh(client, "echo kept > kept.txt"))[0] == 0
        client._writer.transport.abort()  # the connection drops (the SDK's own transport)
        while not client.resumes:
            await asyncio.sleep(0.01)
        assert (await sh(client, "cat kept.txt"))[1] == "kept\n"  # resumed: same workspace
        await client.close()
        assert wait_until(lambda: workspace not in os.listdir(ws / "s"), 10)

    try:
        arun(main())
    finally:
        assert srv.stop() == 0


def test_no_workspace_without_the_flag(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, tcp=False).start()

    async def main() -> None:
        client = await Client.connect(srv.unix)
        ready = await client.handshake(["shell_exec", "workspaces"])
        assert "smith_fast.workspace" not in ready.service_info
        assert "workspaces" not in ready.service_info["granted_capabilities"]
        await client.close()

    try:
        arun(main())
    finally:
        assert srv.stop() == 0



def test_many_recorded_commands_keep_the_layer_stack_bounded(places: dict[str, pathlib.Path]) -> None:
    """Each recorded command freezes a layer; they are merged as a binary counter merges (overlayfs
    takes at most 500 layers, and each lookup walks them): every file stays, the newest --max-undo
    requests can still be undone, the oldest not, and the frozen directories nobody needs go."""
    ws = places["ws"].parent / "ws-undo"
    srv = start(places, "--max-undo", "4", "--warm-workspaces", "0", ws=ws)

    async def main() -> None:
        client, ready = await session(srv, "py", accept=("changes",))
        rids = [str(uuid.uuid4()) for _ in range(40)]
        for i, rid in enumerate(rids):
            assert (await sh(client, f"echo {i} > f{i}; echo {i} >> all", rid=rid))[0] == 0
        code, out, _, _ = await sh(client, "cat all | wc -l; ls | grep -c '^f'")
        assert out == "40\n40\n"
        with pytest.raises(SmithError) as caught:
            await client.undo(rids[0])
        assert caught.value.details.get("reason") == "undo_expired"
        undone = await client.undo(rids[-1])
        assert [c.path for c in undone.changes] == ["all", "f39"] and undone.conflicts == []
        assert (await sh(client, "test -e f39; echo $?; wc -l < all"))[1] == "1\n39\n"
        mounts = pathlib.Path(f"/proc/{srv.pid}/mountinfo").read_text()
        roots = [line for line in mounts.splitlines() if " overlay " in line and str(ws) in line]
        assert roots, mounts[-2000:]
        layers_mounted = [line.count("/layers/") for line in roots]
        assert layers_mounted and 1 <= max(layers_mounted) <= 5, layers_mounted  # merged as a binary counter: popcount(40) = 2, the newest layers on top
        # the frozen directories of requests too old to undo went (their memory with them)
        frozen = pathlib.Path(f"/proc/{srv.pid}/root{ws}/s/{ready.service_info['smith_fast.workspace']}/layers")
        assert wait_until(lambda: len(os.listdir(frozen)) < 30, 5), sorted(os.listdir(frozen))
        await client.close()

    try:
        arun(main())
    finally:
        assert srv.stop() == 0


def test_a_checkpoint_outlives_its_session_for_the_ttl_then_goes_with_its_memory(places: dict[str, pathlib.Path]) -> None:
    ws = places["ws"].parent / "ws-ttl"
    srv = start(places, "--checkpoint-ttl", "1.5s", "--warm-workspaces", "0", ws=ws)

    async def main() -> None:
        origin, ready = await session(srv, "py")
        volume = ready.service_info["smith_fast.workspace"]
        assert (await sh(origin, "echo kept > kept"))[0] == 0
        checkpoint = await origin.checkpoint()
        await origin.close()
        fork, _ = await session(srv, fork=checkpoint)  # its session ended: the checkpoint is still there
        assert (await sh(fork, "cat kept"))[1] == "kept\n"
        await fork.close()
        await asyncio.sleep(2.0)
        late = await Client.connect(srv.unix)
        with pytest.raises(SmithError) as caught:
            await late.handshake(CAPS, client_info={"smith_fast.fork": checkpoint})
        assert caught.value.details.get("reason") == "unknown_checkpoint"
        await late.close()
        assert wait_until(lambda: volume not in os.listdir(ws / "s"), 5)  # its tmpfs unmounted, its directory gone

    try:
        arun(main())
    finally:
        assert srv.stop() == 0


def test_an_mcp_session_gets_a_workspace_of_its_own(places: dict[str, pathlib.Path]) -> None:
    """Two MCP clients (the official SDK, over stdio) of services on one --workspaces directory
    each work in their own copy of the template."""
    import json
    import sys

    from mcp import StdioServerParameters
    from mcp.client.client import Client as McpClient
    from mcp.client.stdio import stdio_client

    from harness.server import ROOT

    ws = places["ws"].parent / "ws-mcp"

    async def one(n: int) -> tuple[str, str]:
        args = ["-m", "smith_fast", "serve", "--mcp", "--root", str(places["root"]), "--workspaces", str(ws / str(n)),
                "--template", f"py={places['py']}"]
        params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
        with open(ws.parent / f"mcp-{n}.log", "w") as errlog:
            async with McpClient(stdio_client(params, errlog=errlog)) as client:
                wrote = await client.call_tool("fs.write", {"path": "mine.txt", "content": f"session {n}"})
                assert not wrote.is_error, wrote.content
                ran = await client.call_tool("shell", {"command": "cat mine.txt; echo; cat main.py; pwd"})
                read = await client.call_tool("fs.read", {"path": "mine.txt"})
                return ran.content[0].text, json.loads(read.content[0].text)["content"]  # type: ignore[union-attr]

    async def main() -> None:
        (a_ran, a_read), (b_ran, b_read) = await asyncio.gather(one(1), one(2))
        assert "session 1" in a_ran and "session 2" not in a_ran and "print('template')" in a_ran and str(ws / "1") in a_ran
        assert "session 2" in b_ran and "session 1" not in b_ran
        assert (a_read, b_read) == ("session 1", "session 2")
        assert not (places["py"] / "mine.txt").exists() and not (places["root"] / "mine.txt").exists()

    arun(main())


def test_read_only_sandbox_and_sandbox_off(places: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    """--sandbox read-only: commands read their workspace and write nowhere; --sandbox off cannot
    keep sessions apart, so the service refuses to start with it."""
    srv = start(places, "--sandbox", "read-only", "--warm-workspaces", "0", ws=places["ws"].parent / "ws-ro")

    async def main() -> None:
        client, _ = await session(srv, "py")
        assert (await sh(client, "cat main.py"))[1] == "print('template')\n"
        code, _, err, _ = await sh(client, "echo x > new.txt")
        assert code != 0 and "Read-only" in err
        await client.close()

    try:
        arun(main())
    finally:
        assert srv.stop() == 0
    off = ServerProcess(tmp_path, "--workspaces", str(places["ws"].parent / "ws-off"), "--sandbox", "off", tcp=False)
    with pytest.raises(Exception, match="needs the sandbox"):
        off.start()


# ---- what the service does between sessions and between requests -------------------------------


def test_a_workspace_no_request_touched_serves_the_next_session_and_one_a_request_ran_in_never(places: dict[str, pathlib.Path]) -> None:
    ws = places["ws"].parent / "ws-recycle"
    srv = start(places, "--warm-workspaces", "1", ws=ws)

    async def main() -> None:
        first, ready = await session(srv, "py")
        untouched = ready.service_info["smith_fast.workspace"]
        await first.close()
        # its volume goes back to the warm pool as it is, and is the next one taken
        await asyncio.sleep(0.3)
        second, ready = await session(srv, "py")
        assert ready.service_info["smith_fast.workspace"] == untouched
        assert (await sh(second, "ls -A; ls -A ~"))[1] == "main.py\npkg\n"  # the template, an empty home: nothing of before
        assert (await sh(second, "echo mine > mine.txt; echo secret > ~/secret"))[0] == 0
        await second.close()
        await asyncio.sleep(0.3)
        # a request ran in it: its volume is unmounted, never handed to another session
        third, ready = await session(srv, "py")
        assert ready.service_info["smith_fast.workspace"] != untouched
        assert (await sh(third, "ls -A; ls -A ~"))[1] == "main.py\npkg\n"
        assert wait_until(lambda: untouched not in os.listdir(ws / "s"), 10)
        # a checkpoint of a session that wrote nothing is a request too: that volume is not reused either
        fourth, ready = await session(srv, "py")
        checkpointed = ready.service_info["smith_fast.workspace"]
        await fourth.checkpoint()
        await fourth.close()
        await asyncio.sleep(0.3)
        fifth, ready = await session(srv, "py")
        assert ready.service_info["smith_fast.workspace"] != checkpointed
        await third.close()
        await fifth.close()

    try:
        arun(main())
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_a_recorded_requests_layer_is_frozen_once_it_ended(server: ServerProcess) -> None:
    """The upper a recorded request wrote becomes its layer as soon as it ended (the workspace
    quiet): what an unrecorded request writes afterwards is not that request's, and its Undo keeps it."""

    async def main() -> None:
        client, _ = await session(server, "py", accept=("changes",))
        rid = str(uuid.uuid4())
        code, _, _, final = await sh(client, "echo f > f", rid=rid)
        assert code == 0 and final is not None and changes_of(final) == {"f": ("added", 2)}
        await asyncio.sleep(0.3)  # its end settled: the layer is frozen
        ran = await client.call_tool("shell.run", {"command": "echo g > g"})  # no layer of its own
        assert ran.success
        undone = await client.undo(rid)
        assert undone.conflicts == []
        assert (await sh(client, "ls"))[1] == "g\nmain.py\npkg\n"  # f undone, g (written after it ended) kept
        await client.close()

    arun(main())
