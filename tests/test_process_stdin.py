"""ShellProcess's stdin and pseudo-terminal (process.py), on both event loops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smith_fast.errors import ProtocolError
from smith_fast.process import STDERR, STDOUT, ShellProcess


class Collect:
    def __init__(self) -> None:
        self.data = {STDOUT: bytearray(), STDERR: bytearray()}

    def __call__(self, fd: int, chunk: bytes) -> None:
        self.data[fd] += chunk


def test_stdin_pipe_written_and_closed(run: Any) -> None:
    async def main() -> None:
        out = Collect()
        taken: list[int] = []
        proc = await ShellProcess.start("cat; echo end", on_output=out, stdin=True, on_stdin=taken.append)
        assert proc.stdin_open and not proc.is_pty
        assert proc.write_stdin(b"hello\n")
        proc.close_stdin()
        assert not proc.stdin_open
        assert await proc.wait(timeout=10) == 0
        assert bytes(out.data[STDOUT]) == b"hello\nend\n"
        assert taken == [6]
        with pytest.raises(ValueError):
            proc.write_stdin(b"late")

    run(main())


def test_stdin_is_dev_null_without_the_option(run: Any) -> None:
    async def main() -> None:
        out = Collect()
        proc = await ShellProcess.start("readlink /proc/self/fd/0; cat", on_output=out)
        assert await proc.wait(timeout=10) == 0
        assert bytes(out.data[STDOUT]) == b"/dev/null\n"
        assert not proc.stdin_open
        with pytest.raises(ValueError):
            proc.write_stdin(b"x")

    run(main())


def test_a_child_that_does_not_read_gets_at_most_the_limit(run: Any) -> None:
    async def main() -> None:
        proc = await ShellProcess.start("sleep 0.5; wc -c", on_output=(out := Collect()), stdin=True, stdin_limit=200_000)
        piece = b"x" * 50_000
        accepted = 0
        while proc.write_stdin(piece):
            accepted += 1
            assert proc.stdin_buffered <= 200_000
        assert not proc.write_stdin(piece)  # refused whole: nothing of it was kept
        proc.close_stdin()
        assert await proc.wait(timeout=10) == 0
        assert int(out.data[STDOUT]) == accepted * len(piece)

    run(main())


def test_pty_controlling_terminal_size_resize_and_ctrl_c(run: Any) -> None:
    async def main() -> None:
        out = Collect()
        script = "tty; stty size; trap 'stty size' WINCH; echo ready; while :; do sleep 0.05; done"
        proc = await ShellProcess.start(script, on_output=out, pty=(30, 100))
        assert proc.is_pty and proc.stdin_open
        while b"ready" not in out.data[STDOUT]:
            await asyncio.sleep(0.02)
        assert out.data[STDOUT].startswith(b"/dev/pts/") and b"30 100\r\n" in out.data[STDOUT]
        proc.resize(40, 120)
        while b"40 120" not in out.data[STDOUT]:
            await asyncio.sleep(0.02)
        proc.write_stdin(b"\x03")  # the terminal's Ctrl-C: SIGINT to the foreground group
        assert await proc.wait(timeout=10) in (130, -2)
        assert not out.data[STDERR]  # one terminal: everything is STDOUT

    run(main())


def test_pty_end_of_input_is_ctrl_d(run: Any) -> None:
    async def main() -> None:
        out = Collect()
        proc = await ShellProcess.start("cat; echo done", on_output=out, pty=(24, 80))
        proc.write_stdin(b"abc\r")
        proc.close_stdin()
        assert await proc.wait(timeout=10) == 0
        assert out.data[STDOUT].endswith(b"done\r\n") and b"abc" in out.data[STDOUT]

    run(main())


def test_pty_with_a_missing_shell_is_a_spawn_error(run: Any) -> None:
    async def main() -> None:
        with pytest.raises(ProtocolError, match="not found") as info:
            await ShellProcess.start("true", shell="no-such-shell", on_output=Collect(), pty=(24, 80))
        assert info.value.details["reason"] == "spawn_failed"

    run(main())
