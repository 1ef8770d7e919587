"""``--root`` is where commands run unless they say otherwise.

A real ``smith-fast serve --root W`` whose own current directory is the repository (not ``W``): a
ShellExec without ``cwd`` runs in ``W``, a relative ``cwd`` is taken from ``W``, an absolute one is
kept (refused outside ``W`` unless ``--sandbox off``), plan steps run in ``W``, and all of it agrees with ``shell.run``. The same for a real
``smith-fast worker --root W`` behind a gateway, over a real nats-server.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from smith_fast.client import Client, SmithError

from .server import ROOT, ServerProcess

PROTOCOLS = ["v1", "v0"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("rootcwd") / "workspace"
    (root / "sub" / "deeper").mkdir(parents=True)
    return pathlib.Path(os.path.realpath(root))


@pytest.fixture(scope="module")
def server(workspace: pathlib.Path):  # type: ignore[no-untyped-def]
    srv = ServerProcess(workspace.parent, root=workspace).start()
    assert pathlib.Path(os.readlink(f"/proc/{srv.pid}/cwd")) == ROOT != workspace  # the test means something
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def _pwd(client: Client, cwd: str | None = None) -> str:
    out = ""
    code = None
    async for ev in client.shell_exec("pwd", cwd=cwd):
        if ev.WhichOneof("event_type") == "shell_output":
            out += ev.shell_output.stdout if ev.shell_output.HasField("stdout") else ""
            if ev.shell_output.finished:
                code = ev.shell_output.exit_code
    assert code == 0
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_shell_exec_runs_in_the_root(server: ServerProcess, workspace: pathlib.Path, protocol: str) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        await client.handshake()
        assert await _pwd(client) == f"{workspace}\n"
        assert await _pwd(client, "") == f"{workspace}\n"
        assert await _pwd(client, "sub") == f"{workspace}/sub\n"
        assert await _pwd(client, "sub/deeper/..") == f"{workspace}/sub\n"
        # under the default sandbox a cwd outside the root is refused (below: kept with it off)
        with pytest.raises(SmithError, match="PERMISSION_DENIED.*cwd '/' is outside the workspace root"):
            await _pwd(client, "/")
        tool = await client.call_tool("shell.run", {"command": "pwd"})
        assert tool.success and json.loads(tool.result)["stdout"] == f"{workspace}\n"
        tool = await client.call_tool("shell.run", {"command": "pwd", "cwd": "sub"})
        assert json.loads(tool.result)["stdout"] == f"{workspace}/sub\n"


async def test_an_absolute_cwd_is_kept_with_the_sandbox_off(workspace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # --sandbox off: today's behaviour, where an absolute cwd outside the root is where it runs
    srv = ServerProcess(tmp_path, "--sandbox", "off", root=workspace).start()
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            assert await _pwd(client, "/") == "/\n"
            assert await _pwd(client) == f"{workspace}\n"
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def test_a_relative_cwd_that_is_not_there_names_where_it_was_looked_for(server: ServerProcess, workspace: pathlib.Path) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        with pytest.raises(SmithError, match=f"{workspace}/nope"):
            await _pwd(client, "nope")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_plan_steps_run_in_the_root(server: ServerProcess, workspace: pathlib.Path, protocol: str) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        await client.handshake(["shell_exec"])
        events = [ev async for ev in client.plan("pwd && cd sub && pwd", {"execute": "true"})]
    out = "".join(
        ev.shell_output.stdout for ev in events if ev.WhichOneof("event_type") == "shell_output" and ev.shell_output.HasField("stdout")
    )
    # each step is a command of its own: the second pwd runs in the root again after `cd sub`
    assert out == f"{workspace}\n{workspace}\n"


async def test_worker_runs_commands_in_its_root(tmp_path: pathlib.Path) -> None:
    from .test_nats import NATS_FAST, Cluster, _collect, _output, _shell

    cluster = Cluster(tmp_path, workers=1, nats_args=NATS_FAST)
    (cluster.root / "sub").mkdir()
    root = pathlib.Path(os.path.realpath(cluster.root))
    cluster.start()
    try:
        assert pathlib.Path(os.readlink(f"/proc/{cluster.workers[0].pid}/cwd")) == ROOT != root
        async with await Client.connect(cluster.unix) as client:
            await client.handshake()
            out, _, code = _output(await _collect(client, _shell("pwd")))
            assert (out, code) == (f"{root}\n", 0)
            cmd = _shell("pwd")
            cmd.shell_exec.cwd = "sub"
            out, _, code = _output(await _collect(client, cmd))
            assert (out, code) == (f"{root}/sub\n", 0)
    finally:
        codes = cluster.stop()
    assert set(codes.values()) == {0}, codes


def test_cwd_is_taken_from_the_root() -> None:
    from smith_fast.service.shell_exec import working_directory

    root = pathlib.Path("/srv/w")
    assert working_directory(root, None) == "/srv/w"
    assert working_directory(root, "") == "/srv/w"
    assert working_directory(root, "a/b") == "/srv/w/a/b"
    assert working_directory(root, "/etc") == "/etc"
