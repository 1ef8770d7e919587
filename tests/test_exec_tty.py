"""``smith-fast exec`` as a user drives it: stdin forwarded, byte-exact output,
Ctrl-C, and ``exec -t`` with interactive programs, through a real pseudo-terminal (pexpect)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pexpect
import pytest

from harness.server import ServerProcess

CLI = [sys.executable, "-m", "smith_fast"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("exec-tty")
    srv = ServerProcess(tmp, "--kill-grace", "1s").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def exec_(server: ServerProcess, *args: str, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, "exec", "--connect", server.address("unix"), *args], input=input, capture_output=True, timeout=timeout)


def spawn(server: ServerProcess, *args: str, rows: int = 24, cols: int = 80) -> pexpect.spawn:
    child = pexpect.spawn(CLI[0], [*CLI[1:], "exec", "--connect", server.address("unix"), *args],
                          timeout=20, dimensions=(rows, cols), env={**os.environ, "TERM": "xterm"})
    return child


def test_stdin_is_forwarded_when_it_is_not_a_terminal(server: ServerProcess) -> None:
    res = exec_(server, "cat", input=b"hello\n")
    assert (res.returncode, res.stdout) == (0, b"hello\n")
    big = os.urandom(3 << 20)  # more than the service's stdin buffer: flow control keeps it whole
    res = exec_(server, "sleep 0.3; cat", input=big)
    assert res.returncode == 0 and res.stdout == big


def test_stdin_from_a_file(server: ServerProcess, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"line 1\nline 2\n")
    with path.open("rb") as f:
        res = subprocess.run([*CLI, "exec", "--connect", server.address("unix"), "wc", "-l"], stdin=f, capture_output=True, timeout=60)
    assert res.stdout.strip() == b"2"


def test_output_is_byte_exact(server: ServerProcess) -> None:
    res = exec_(server, "printf '\\377\\376ab'; printf '\\377' >&2")
    assert (res.stdout, res.stderr) == (b"\xff\xfeab", b"\xff")
    blob = bytes(range(256)) * 4096
    (server.root / "image.png").write_bytes(blob)
    res = exec_(server, "cat image.png")
    assert res.stdout == blob


def test_ctrl_c_cancels_the_command_and_says_interrupted(server: ServerProcess) -> None:
    marker = f"sleep 4242.{os.getpid()}"  # this run's own: another checkout's suite may run the same test at once
    proc = subprocess.Popen([*CLI, "exec", "--connect", server.address("unix"), f"echo up; {marker}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert err.decode().strip() == "smith-fast: interrupted"
    assert not pexpect.run(f"pgrep -f '{marker}'").strip()


def test_tty_python3_repl_resize_and_ctrl_c(server: ServerProcess) -> None:
    child = spawn(server, "-t", "python3", rows=30, cols=90)
    child.expect(b">>> ")
    child.sendline(b"import os, signal; print(os.isatty(0), os.get_terminal_size())")
    child.expect(rb"True os.terminal_size\(columns=90, lines=30\)")
    child.setwinsize(40, 100)  # SIGWINCH here: forwarded as a resize
    child.sendline(b"import time; time.sleep(0.5); print(os.get_terminal_size())")
    child.expect(rb"columns=100, lines=40")
    child.sendline(b"time.sleep(30)")
    time.sleep(0.5)
    child.sendcontrol("c")  # raw mode: the byte goes to the remote terminal, whose python gets SIGINT
    child.expect(b"KeyboardInterrupt")
    child.expect(b">>> ")
    child.sendline(b"print(6 * 7)")
    child.expect(b"42")
    child.sendline(b"raise SystemExit(3)")
    child.expect(pexpect.EOF)
    child.close()
    # /bin/sh (dash) also saw the Ctrl-C while it waited for python: it reports it (as on a terminal)
    assert child.exitstatus in (3, 130)


def test_tty_read_p_prompt(server: ServerProcess) -> None:
    child = spawn(server, "-t", "read -p 'name? ' n; echo \"hello $n\"; exit 4")
    child.expect(b"name\\? ")
    child.sendline(b"ada")
    child.expect(b"hello ada")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4


def test_tty_vi_edits_a_file(server: ServerProcess) -> None:
    vi = shutil.which("vim.tiny") or shutil.which("vi") or shutil.which("vim")
    assert vi, "install vim-tiny: apt-get install vim-tiny"
    target = server.root / "notes.txt"
    target.write_text("first\n")
    child = spawn(server, "-t", f"{vi} -u NONE -N -i NONE {target}")
    child.expect(b"first")
    child.send(b"Gosecond line\x1b")  # a new last line, then Escape
    child.send(b":wq\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert target.read_text() == "first\nsecond line\n"


def test_tty_git_commit_with_an_editor(server: ServerProcess) -> None:
    repo = server.root / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True)
    vi = shutil.which("vim.tiny") or shutil.which("vi") or "vi"
    command = (f"cd {repo} && GIT_EDITOR='{vi} -u NONE -N -i NONE' git -c user.name=t -c user.email=t@e commit -q && "
               "git log --format=%s -1")
    child = spawn(server, "-t", command)
    child.expect(b"Please enter the commit message")
    child.send(b"ggOadd a from the editor\x1b:wq\r")
    child.expect(b"add a from the editor")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_the_terminal_is_restored_on_every_exit_path(server: ServerProcess) -> None:
    # exec -t in an interactive sh on a pty: after it ends (normally, with an error, by a signal),
    # `stty -g` prints the same settings as before it ran.
    sh = pexpect.spawn("/bin/sh", ["-i"], timeout=20, env={**os.environ, "PS1": "$ "})
    sh.expect(b"\\$ ")

    def settings() -> bytes:
        sh.sendline(b"stty -g")
        sh.expect(rb"([0-9a-f:]{20,})\r\n")
        value = sh.match.group(1)
        sh.expect(b"\\$ ")
        return value

    before = settings()
    base = " ".join([*CLI, "exec", "--connect", server.address("unix")])
    for run in ("-t 'exit 0'", "-t 'exit 9'", "-t 'kill -KILL $$'", "-t --cwd /nonexistent true"):
        sh.sendline(f"{base} {run}; echo rc=$?".encode())
        sh.expect(rb"rc=(\d+)")
        sh.expect(b"\\$ ")
        assert settings() == before, run
    # killed by SIGTERM while it runs in the foreground
    marker = f"sleep 31.{os.getpid()}"  # this run's own, as above
    sh.sendline(f"{base} -t 'echo started; {marker}'; echo rc=$?".encode())
    sh.expect(b"started\r\n")  # the command's output, not the echo of the line typed
    [pid] = [pid for pid, cmdline in cli_pids() if marker.encode() in cmdline]
    os.kill(pid, signal.SIGTERM)
    sh.expect(rb"rc=(\d+)", timeout=30)
    assert sh.match.group(1) == b"143"
    sh.expect(b"\\$ ")
    assert settings() == before
    sh.sendline(b"exit")
    sh.expect(pexpect.EOF)


def cli_pids() -> list[tuple[int, bytes]]:
    """(pid, command line) of the running ``python -m smith_fast exec`` processes."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"smith_fast\0exec" in cmdline:
                out.append((int(entry), cmdline))
    return out


def test_raw_mode_while_it_runs(server: ServerProcess) -> None:
    # The local terminal is raw: no echo of its own (what we see once is the remote terminal's echo
    # and cat's copy), and ^D is a byte for the remote terminal, not the local end of input.
    child = spawn(server, "-t", "echo ready; cat")
    child.expect(b"ready\r\n")
    child.send(b"abc\r")
    child.expect(b"abc\r\nabc\r\n")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    assert b"abc" not in child.before
    child.close()
    assert child.exitstatus == 0
