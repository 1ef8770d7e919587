"""Warm shells (smith_fast/warm_shell.py): a session's next command runs in a shell started ahead.

Through a real server with its default sandbox: what a command sees from a warm shell is what
``sh -c`` shows it (output, errors, status, stdin, directory), with and without a stdin of its own;
what cannot run warm starts the usual way; nothing of the script machinery leaks into a command.
Each case checks that it ran warm (``$-`` holds ``s`` there, nothing under ``sh -c``), so none
passes by taking the usual path.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from smith_fast import warm_shell
from smith_fast.client import Client

from harness.server import ServerProcess

SH = shutil.which("sh") or "/bin/sh"
WARM = 'case $- in *s*) echo warm >&2;; *) echo cold >&2;; esac\n'  # a line of its own: before a syntax error too


@pytest.fixture(scope="module")
def root() -> pathlib.Path:
    """The service's root: the commands' directory."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-warm-", dir="/var/tmp"))
    (base / "root").mkdir()
    return base / "root"


@pytest.fixture(scope="module")
def server(root: pathlib.Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(root.parent, root=root).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def _sh_c(shell: str, command: str, cwd: str) -> tuple[int, bytes, bytes]:
    """``shell -c command`` run here, as the service's usual path runs it."""
    done = subprocess.run([shell, "-c", command], stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd, check=False)
    return done.returncode, done.stdout, done.stderr


async def _first(client: Client, cwd: str, **options: object) -> str:
    """The session's first command (the next one's shell starts now): the shell's path, as ``$0``."""
    done = await client.run("echo $0", cwd=cwd, **options)
    assert done.exit_code == 0, done
    return done.stdout.decode().strip()


def test_the_shell_here_is_dash_and_reads_its_script_whole() -> None:
    # The rest of this file is about warm shells: they need dash (the machine's /bin/sh)
    assert warm_shell.read_size(SH) == 8192
    assert warm_shell.read_size(shutil.which("bash") or "/bin/bash") == 0
    assert warm_shell.script("echo hi", SH, "/it's", {}, False) == (
        warm_shell.PREFIX + b"cd -P -- '/it'\\''s' || exit 126; unset OLDPWD; echo hi")
    assert warm_shell.script("echo hi", SH, "/", {"OLDPWD": "/a b"}, True) == (
        b"cd -P -- '/' || exit 126; OLDPWD='/a b'; { echo hi\n} <&3 3<&-")
    assert warm_shell.script("ls", SH, "/", {"A": "1", "S": "s"}, False, {"B": "2", "S": "s", "PWD": "/x"}) == (
        warm_shell.PREFIX + b"export A='1'; unset B; cd -P -- '/' || exit 126; unset OLDPWD; ls")
    assert warm_shell.script("ls", SH, "/", {"LANG": "C"}, False, {"LANG": "C.UTF-8"}) is None  # read as it starts
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX"):  # by its loader and C library
        assert warm_shell.script("ls", SH, "/", {name: "x"}, False, {}) is None
        assert warm_shell.script("ls", SH, "/", {}, False, {name: "x"}) is None
    assert warm_shell.script("ls", SH, "/", {"A-B": "1"}, False, {}) is None  # no shell name
    assert warm_shell.script("ls", SH, "/", {"A": "x\0y"}, False, {}) is None  # sh -c's start would refuse it
    assert warm_shell.script("exec 2>&1; ls", SH, "/", {}, False) is None
    assert warm_shell.script("ls; \\exec <x", SH, "/", {}, False) is None
    assert warm_shell.script("find . -exec true {} +; ls /x/bench-exec-start", SH, "/", {}, False) is not None
    assert warm_shell.script("x" * 9000, SH, "/", {}, False) is None
    assert warm_shell.script("# only a comment", SH, "/", {}, True) is None
    assert warm_shell.script("find . -exec true {} +", SH, "/", {}, True) is not None


def _warm_here(command: str, cwd: str, stdin: bytes | None) -> tuple[int, bytes, bytes]:
    """``command`` as a warm shell runs it, here: ``sh -s`` started in ``/``, its script on its
    stdin, the command's stdin (if any) on its fd 3."""
    text = warm_shell.script(command, SH, cwd, dict(os.environ), stdin is not None)
    assert text is not None
    r, w = os.pipe()
    os.write(w, text)
    os.close(w)
    argv, passed = [SH, "-s"], [r]
    if stdin is not None:  # its fd 3, put there by a process that then execs it
        r3, w3 = os.pipe()
        os.write(w3, stdin)
        os.close(w3)
        put = "import os, sys; os.dup2(int(sys.argv[1]), 3); os.close(int(sys.argv[1])); os.execv(sys.argv[2], sys.argv[2:])"
        argv, passed = [sys.executable, "-c", put, str(r3), SH, "-s"], [r, r3]
    try:
        done = subprocess.run(argv, stdin=r, capture_output=True, cwd="/", check=False, pass_fds=passed[1:])
    finally:
        for fd in passed:
            os.close(fd)
    return done.returncode, done.stdout, done.stderr


# What the group (a command with a stdin) words otherwise: a command that does not parse to its
# end; still an error, status 2, with nothing run.
_GROUP_WORDS_OTHERWISE = ("echo 'unterminated", "ls |")


@pytest.mark.parametrize("stdin", [None, b"input\n"], ids=["no-stdin", "stdin"])
@pytest.mark.parametrize("command", [
    "if then", "echo a; if then", "nosuchcommand", "echo 'unterminated", "echo $0 $# \"$*\" \"$PWD\" \"${OLDPWD-unset}\"",
    "f() { return 3; }; f; echo $?", "echo a; exit 7", "set -e; false; echo not-here", "trap 'echo bye' EXIT; false",
    "echo one\nnosuch\necho three", "readlink /proc/self/fd/0 /proc/self/fd/3", "ls |", "cd /; echo $PWD $OLDPWD"])
def test_a_warm_script_does_what_sh_c_does(command: str, stdin: bytes | None, tmp_path: pathlib.Path) -> None:
    # The script forms themselves, against `sh -c` run in the directory (stdin /dev/null, or the
    # data as its stdin), both here: the same status, output and errors (a syntax error on the
    # first line, before anything ran, too)
    cwd = str(tmp_path)
    if stdin is None:
        expected = subprocess.run([SH, "-c", command], stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd, check=False)
    else:
        expected = subprocess.run([SH, "-c", command], input=stdin, capture_output=True, cwd=cwd, check=False)
    got = _warm_here(command, cwd, stdin)
    if stdin is not None and command in _GROUP_WORDS_OTHERWISE:
        assert expected.returncode == got[0] == 2 and got[1] == expected.stdout == b"" and b"Syntax error" in got[2], got
        return
    if "readlink" in command:  # stdin: /dev/null or a pipe as under sh -c, and no fd 3 left
        assert got[1].splitlines()[0] == (b"/dev/null" if stdin is None else got[1].splitlines()[0]), got
        assert got[1].startswith(b"pipe:") or stdin is None and got[1] == b"/dev/null\n", got
        return
    assert got == (expected.returncode, expected.stdout, expected.stderr), (got, expected)


CASES = [
    "echo $0 $# \"$*\"",
    "nosuchcommand",
    "if then",
    "echo a; exit 7",
    "cat; echo read-nothing",
    "readlink /proc/self/fd/0; ls /proc/self/fd | wc -l",
    "trap 'echo bye' EXIT; false",
    "echo 'unterminated",
    "echo a \\",
    "set -e; false; echo not-here",
    "ls |",
    "f() { return 3; }; f; echo $?",
    "printf '%s\\n' \"$PWD\"",
]


@pytest.mark.parametrize("command", CASES)
async def test_a_warm_command_sees_what_sh_c_shows(server: ServerProcess, root: pathlib.Path, command: str) -> None:
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        shell = await _first(client, cwd)
        got = await client.run(WARM + command, cwd=cwd)
    expected = _sh_c(shell, WARM + command, cwd)
    assert got.stderr.startswith(b"warm\n") and expected[2].startswith(b"cold\n"), (got, expected)
    assert (got.exit_code, got.stdout, got.stderr[5:]) == (expected[0], expected[1], expected[2][5:]), (got, expected)


async def test_what_cannot_run_warm_starts_the_usual_way(server: ServerProcess, root: pathlib.Path) -> None:
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd)
        # exec (it could point the shell's stdin elsewhere), a variable the shell reads as it
        # starts (its locale), a long command, another directory
        (root / "sub").mkdir()
        other = str(root / "sub")
        for command, env, where in (("exec 2>&1; " + WARM, None, cwd), (WARM, {"LANG": "C"}, cwd),
                                    (WARM + ": " + "x" * 9000, None, cwd), (WARM, None, other)):
            got = await client.run(command, cwd=where, env=env)
            assert got.exit_code == 0 and b"cold" in got.stdout + got.stderr, (command[:20], env, where, got)
        # and the one after such a command is warm again (its shell was made like it)
        last = await client.run(WARM + "echo ok", cwd=other)
        assert (last.stdout, last.stderr) == (b"ok\n", b"warm\n"), last


async def test_after_a_burst_the_second_command_in_another_directory_runs_warm(server: ServerProcess, root: pathlib.Path) -> None:
    # A burst keeps two warm shells, both for the directory its commands ran in. The first command
    # in another directory starts the usual way and has the next shell made for its directory; the
    # second finds that one behind the other directory's, which is let go: it runs warm (the
    # first directory's shell at the head would make it start the usual way too).
    cwd = str(root)
    other = root / "burst-other"
    other.mkdir(exist_ok=True)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd)
        ran = [await client.run(WARM + "true", cwd=cwd) for _ in range(3)]
        assert [r.stderr for r in ran] == [b"warm\n"] * 3, ran
        first = await client.run(WARM + "true", cwd=str(other))
        assert first.stderr == b"cold\n", first
        second = await client.run(WARM + "pwd -P", cwd=str(other))
        assert (second.exit_code, second.stdout, second.stderr) == (0, str(other.resolve()).encode() + b"\n", b"warm\n"), second


async def test_a_script_longer_than_a_page_runs_warm(server: ServerProcess, root: pathlib.Path) -> None:
    # Within what the shell reads at once, but past what a new pipe surely holds (a page, once the
    # user's pipes pass pipe-user-pages-soft): its pipe is enlarged for it before the one write.
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd)
        got = await client.run(WARM + ": " + "x" * 6000 + "; echo long", cwd=cwd)
    assert (got.exit_code, got.stdout, got.stderr) == (0, b"long\n", b"warm\n"), got


async def test_a_warm_command_gets_the_variables_it_was_given(server: ServerProcess, root: pathlib.Path) -> None:
    # Its shell started with the last command's environment: what differs is set by its script
    # (a per-command TRACEPARENT, a variable the MCP shell carries), what is gone is unset
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd, env={"GONE": "1", "SAME": "s"})
        got = await client.run(WARM + "printf '%s|%s|%s\\n' \"$NEW\" \"${GONE-unset}\" \"$SAME\"; env | grep -c '^NEW='",
                               cwd=cwd, env={"NEW": "it's a \"value\" $x", "SAME": "s"})
    assert (got.exit_code, got.stdout, got.stderr) == (0, b"it's a \"value\" $x|unset|s\n1\n", b"warm\n"), got


async def test_a_directory_made_again_is_the_one_a_warm_command_enters(server: ServerProcess, root: pathlib.Path) -> None:
    work = root / "again"
    work.mkdir()
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, str(work))  # the next command's shell starts for `work`
        # which this one removes and makes again, as `rm -rf build && mkdir build` would
        done = await client.run(f"rm -rf {work} && mkdir {work} && echo new > {work}/file", cwd=str(work))
        assert done.exit_code == 0, done
        got = await client.run(WARM + "pwd; cat file", cwd=str(work))
    assert (got.exit_code, got.stdout, got.stderr) == (0, f"{work}\nnew\n".encode(), b"warm\n"), got


async def test_a_warm_command_with_a_stdin_reads_it_and_only_it(server: ServerProcess, root: pathlib.Path) -> None:
    cwd = str(root)
    script = root / "evil"
    script.write_text("echo INJECTED\n")
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        shell = await _first(client, cwd, input=b"")
        got = await client.run(WARM + "cat; echo $?", cwd=cwd, input=b"line 1\nline 2\n")
        assert (got.exit_code, got.stdout, got.stderr) == (0, b"line 1\nline 2\n0\n", b"warm\n"), got
        # a command that points fd 0 elsewhere for good: its shell's own script input is back
        # after it (nothing of the file is read as commands), and nothing of the script is left
        # for the command to read
        got = await client.run(WARM + f"exec <{script}; read x; echo \"$x\"; ls /proc/self/fd | wc -l", cwd=cwd, input=b"")
        assert got.exit_code == 0 and got.stdout.splitlines()[0] == b"echo INJECTED" and b"INJECTED\n" not in got.stdout.split(b"\n", 1)[1], got
        assert got.stderr == b"warm\n" and got.stdout.splitlines()[1] == b"4", got  # 0, 1, 2 and ls's own
        # errors read as sh -c's
        bad = await client.run(WARM + "nosuchcommand", cwd=cwd, input=b"")
        assert bad.exit_code == 127 and bad.stderr == b"warm\n" + _sh_c(shell, WARM + "nosuchcommand", cwd)[2][5:], bad


async def test_the_warm_shell_waits_in_the_next_commands_cell_and_runs_it(server: ServerProcess, root: pathlib.Path) -> None:
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        shell = await _first(client, cwd)
        first = await client.run(WARM + "echo $$", cwd=cwd)
        second = await client.run(WARM + "echo $$; ps -o pid=,args= -p $$", cwd=cwd)
    assert first.exit_code == second.exit_code == 0 and first.stderr == second.stderr == b"warm\n", second
    pid, (_, argv) = second.stdout.split()[0], second.stdout.decode().splitlines()[1].split(None, 1)
    assert pid != first.stdout.strip() and argv == f"{shell} -s", second  # a shell of its own, started as `sh -s`
    assert os.path.basename(os.path.realpath(SH)) == "dash"


async def test_commands_one_right_after_another_each_run_in_a_warm_shell(server: ServerProcess, root: pathlib.Path) -> None:
    # The first short command of a burst has the next one's shell asked for as it ends
    # (zygote.PREPARE_AFTER): the next command, sent the moment the last one's final event came,
    # can come before the init said the shell runs. It waits for that (Zygote.ready) instead of
    # being forked on its own: 8 in 500 ran cold here before it did (and this test failed 3 runs
    # in 3). From then on each takes one made a command earlier (zygote.BURST_DEPTH).
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd)
        ran = [await client.run(WARM + "true", cwd=cwd) for _ in range(150)]
    assert [r.stderr for r in ran] == [b"warm\n"] * 150, [r for r in ran if r.stderr != b"warm\n"][:3]


async def test_a_command_cannot_write_into_the_next_commands_script(server: ServerProcess, root: pathlib.Path) -> None:
    # The next command's shell waits in the session's pid namespace, reading its script from a
    # pipe: a command of the session (one a model wrote, or what it left running) that could open
    # that pipe through /proc would choose what the next command runs. Each warm shell has a
    # Landlock domain of its own, as each command has: /proc/PID/fd of another is closed to it.
    cwd = str(root)
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        await _first(client, cwd)
        attack = await client.run(  # (the next command's shell starts meanwhile)
            WARM + "sleep 0.5; for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sh ] && [ ${p#/proc/} != $$ ] || continue; "
            "echo found $p; for f in 0 1 2; do echo 'echo INJECTED' > $p/fd/$f && echo wrote $p/fd/$f; done; done",
            cwd=cwd)
        assert attack.stderr.startswith(b"warm\n") and b"found /proc/" in attack.stdout, attack  # it was there
        found = attack.stdout.count(b"found /proc/")  # (in a burst of commands, zygote.BURST_DEPTH wait)
        assert b"wrote" not in attack.stdout and attack.stderr.count(b"Permission denied") == 3 * found, attack
        after = await client.run(WARM + "echo next", cwd=cwd)
    assert (after.exit_code, after.stdout, after.stderr) == (0, b"next\n", b"warm\n"), after
