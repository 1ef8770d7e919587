"""Every path that confines a process with Landlock applies the rules of one place,
``csrc/landlock_policy.h``, and this compares what each path applied, not only what it lets happen.

Each path runs for real with a :class:`~smith_fast.sandbox.Sandbox` whose program is asked, by
``--ruleset-out``, to append the ruleset it applied (once the process is confined, just before the
exec) to a file: a ShellExec's process (``service.spawn``), a ``shell.run`` tool's, the start-up
check, and ``fs.search``'s rg (the Landlock-only form). The commands' rulesets must be the same
ruleset; rg's must grant reads beneath the workspace and nothing else that a racer could use.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from smith_fast.sandbox import HELPER, Sandbox
from smith_fast.sandbox.zygote import Zygotes
from smith_fast.service.spawn import spawn
from smith_fast.tools import ToolContext, default_registry
from smith_fast.tools.search import rg_path

# landlock_policy.h's rights (the kernel's LANDLOCK_ACCESS_FS_* bits).
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
READS = EXECUTE | READ_FILE | READ_DIR
ANY_WRITE = 0xFFFF & ~READS  # every right but reading, listing and executing
LOADER = {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/dev/null"}


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    # Outside /tmp: a command's /tmp is a private one.
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-rulesets-", dir="/var/tmp"))
    (base / "a.txt").write_text("needle\n")
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def recorded(path: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rules(ruleset: dict[str, Any]) -> dict[str, int]:
    return {rule["path"]: rule["access"] for rule in ruleset["rules"]}


async def _shell_exec(command: str, root: pathlib.Path, sandbox: Sandbox, zygotes: Zygotes | None = None) -> int:
    out: list[bytes] = []
    proc = await spawn(command, shell=None, cwd=str(root), env={}, on_output=lambda fd, data: out.append(data), sandbox=sandbox,
                       zygotes=zygotes)
    code = await proc.wait()
    assert code == 0, b"".join(out)
    return code


async def _through_a_zygote(commands: int, root: pathlib.Path, sandbox: Sandbox) -> None:
    zygotes = Zygotes()
    try:
        for _ in range(commands):
            await _shell_exec("true", root, sandbox, zygotes)
    finally:
        zygotes.close()


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_every_command_path_applies_the_same_ruleset(root: pathlib.Path, tmp_path: pathlib.Path, mode: str) -> None:
    out = tmp_path / "rulesets.jsonl"
    sandbox = Sandbox(mode=mode, network="off", root=str(root), wrapper=(HELPER, "--ruleset-out", str(out)))
    registry = default_registry(entry_points=False)
    ctx = ToolContext(root, sandbox=sandbox)

    sandbox.check()  # the start-up probe: the same program, the same rules
    asyncio.run(_shell_exec("true", root, sandbox))  # a ShellExec (and a plan step: launch → spawn)
    result = asyncio.run(registry.call("shell.run", b'{"command": "true"}', ctx))  # a tool's process
    assert result.success, result.error

    # a session's commands, forked by its zygote: the ruleset is built once in the zygote and
    # applied in each of them, the same as the one-shot form's
    asyncio.run(_through_a_zygote(2, root, sandbox))

    probe, shell_exec, shell_run, *forked = recorded(out)
    # the two, and the next command's shell, started ahead (smith_fast/warm_shell.py), if it got
    # as far as its ruleset before the zygote closed
    assert len(forked) in (2, 3), forked
    assert probe == shell_exec == shell_run and all(one == probe for one in forked)
    assert probe["policy"] == "command" and probe["no_new_privs"] == 1 and probe["abi"] >= 3
    granted = rules(probe)
    assert granted["/"] == READS  # read everything (--hide covers what must not be read) ...
    # ... write only beneath the workspace (workspace-write), the private /tmp and /dev/shm
    writable = {path for path, access in granted.items() if access & WRITE_FILE and not path.startswith("/dev/")}
    assert writable == ({str(root)} if mode == "workspace-write" else set()) | {"/tmp"}
    assert all(access & (MAKE_CHAR | MAKE_BLOCK) == 0 for access in granted.values())  # no device nodes, anywhere
    assert probe["handled_net"] == 3  # --network off: no TCP bind or connect either


def test_fs_search_applies_the_reads_ruleset(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "rulesets.jsonl"
    sandbox = Sandbox(mode="off", root=str(root), wrapper=(HELPER, "--ruleset-out", str(out)))
    registry = default_registry(entry_points=False)
    result = asyncio.run(registry.call("fs.search", b'{"pattern": "needle"}', ToolContext(root, sandbox=sandbox)))
    assert result.success, result.error
    assert json.loads(result.result)["matches"] == [{"path": "a.txt", "line": 1, "text": "needle"}]

    (search,) = recorded(out)
    # The same arguments given to the program by hand: the same ruleset, so fs.search's is the
    # policy's, not something search.py made up.
    by_hand = tmp_path / "by-hand.jsonl"
    subprocess.run([HELPER, "--ruleset-out", str(by_hand), "--only-read", str(root), "--", rg_path(), "--version"],
                   check=True, capture_output=True)
    assert recorded(by_hand) == [search]

    assert search["policy"] == "reads" and search["no_new_privs"] == 1
    granted = rules(search)
    assert granted.pop(str(root)) == READ_FILE | READ_DIR  # the workspace: read and list, no more
    assert granted.pop(rg_path()) == EXECUTE | READ_FILE  # rg itself
    assert set(granted) <= LOADER  # and what the dynamic loader reads to start it
    assert all(access & ANY_WRITE == 0 for access in rules(search).values())  # writes nowhere
    assert search["handled_net"] == 3  # no TCP bind or connect


def test_the_policies_share_their_handled_rights(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # Both policies handle every right of the kernel's ABI (denied unless a rule grants it), from
    # the one function that knows them.
    out = tmp_path / "rulesets.jsonl"
    for argv in (["--write", str(root)], ["--only-read", str(root)]):
        subprocess.run([HELPER, "--ruleset-out", str(out), *argv, "--", "/bin/true"], check=True, capture_output=True, cwd="/")
    command, reads = recorded(out)
    assert command["abi"] == reads["abi"] and command["handled_fs"] == reads["handled_fs"]
    assert command["scoped"] == reads["scoped"]


def test_the_reads_form_refuses_the_namespaces_options(root: pathlib.Path) -> None:
    for extra in (["--write", str(root)], ["--hide", str(root)], ["--tty"], ["--network", "off"]):
        done = subprocess.run([HELPER, "--only-read", str(root), *extra, "--", "/bin/true"], capture_output=True)
        assert done.returncode == 2 and b"--only-read" in done.stderr, (extra, done.stderr)
    done = subprocess.run([HELPER, "--only-read", str(root), "--", "true"], capture_output=True)
    assert done.returncode == 2 and b"absolute path" in done.stderr


def test_a_process_under_the_reads_form_reads_only_beneath(root: pathlib.Path) -> None:
    outside = pathlib.Path("/etc/hostname")
    assert outside.read_bytes()  # readable here, unconfined
    done = subprocess.run([HELPER, "--only-read", str(root), "--", "/bin/cat", str(root / "a.txt"), str(outside)],
                          capture_output=True)
    assert done.stdout == b"needle\n" and b"Permission denied" in done.stderr and done.returncode == 1
    done = subprocess.run([HELPER, "--only-read", str(root), "--", "/bin/sh", "-c", f"echo x > {root}/new"],
                          capture_output=True)
    assert done.returncode != 0 and not (root / "new").exists()


def test_a_search_that_cannot_be_confined_fails(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # The program refuses before rg runs (here: a --ruleset-out it cannot open): the call fails
    # saying so, rather than report no match.
    broken = Sandbox(mode="off", root=str(root), wrapper=(HELPER, "--ruleset-out", str(tmp_path / "missing" / "x")))
    registry = default_registry(entry_points=False)
    result = asyncio.run(registry.call("fs.search", b'{"pattern": "needle"}', ToolContext(root, sandbox=broken)))
    assert not result.success and "smith-fast sandbox: cannot open --ruleset-out" in result.error, result.error


RUST_HOOK = "fn before_tool_call(_p: &Json) -> Action {\n    Action::Allow\n}\nhooks! { before_tool_call }\n"


def test_a_rust_hook_and_its_build_apply_the_command_ruleset(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # rustc and the hook's process are started through Sandbox.wrap like a command, each writing
    # only its own directory: the same ruleset as a command's but for which directory that is.
    from smith_fast.hooks import HookLimits, load_hook

    out = tmp_path / "rulesets.jsonl"
    sandbox = Sandbox(mode="workspace-write", root=str(root), wrapper=(HELPER, "--ruleset-out", str(out)))
    asyncio.run(_shell_exec("true", root, sandbox))

    async def hook() -> None:
        loaded = await load_hook("rust", RUST_HOOK, limits=HookLimits(sandbox=sandbox), cache_dir=tmp_path / "cache")
        try:
            await loaded.call("before_tool_call", {"tool": "fs.read", "args": {}, "request_id": "r1"})
        finally:
            await loaded.close()

    asyncio.run(hook())
    command, *others = recorded(out)
    assert len(others) >= 2  # rustc (perhaps more than once) and the hook's process
    shared = {path: access for path, access in rules(command).items() if path != str(root)}
    for ruleset in others:
        theirs = rules(ruleset)
        own = [path for path in theirs if path not in shared]
        assert len(own) == 1 and theirs[own[0]] == rules(command)[str(root)], theirs  # one writable directory
        assert {path: theirs[path] for path in shared} == shared
        assert {k: v for k, v in ruleset.items() if k != "rules"} == {k: v for k, v in command.items() if k != "rules"}
