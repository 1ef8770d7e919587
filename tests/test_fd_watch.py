"""smith_fast.fd_watch: a command's pipes watched through one epoll per loop, on both loops.

The module is compiled in place (``COMPILED_IN_PLACE``); these run against whichever the import
gives, and ``SMITH_FAST_NO_EXTENSIONS=1`` runs them against the source.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from smith_fast.fd_watch import fd_watch

from .conftest import Runner


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    return r, w


def test_one_watch_per_loop_and_a_reader_called_while_its_pipe_holds_data(run: Runner[Any]) -> None:
    # Level-triggered, as a loop reader: a callback that reads one byte a call is called again at
    # the next turn of the loop until the pipe is empty, then no more.
    async def body() -> tuple[list[bytes], bool]:
        loop = asyncio.get_running_loop()
        watch = fd_watch(loop)
        assert fd_watch(loop) is watch
        r, w = _pipe()
        got: list[bytes] = []
        try:
            watch.add(r, lambda fd: got.append(os.read(fd, 1)), r)
            os.write(w, b"abc")
            for _ in range(50):
                await asyncio.sleep(0)
            calls = len(got)
            await asyncio.sleep(0.02)
            quiet = len(got) == calls
            watch.remove(r)
            os.write(w, b"d")
            await asyncio.sleep(0.02)
            return got, quiet and len(got) == calls
        finally:
            watch.remove(r)
            os.close(r)
            os.close(w)

    got, quiet = run(body())
    assert got == [b"a", b"b", b"c"]
    assert quiet  # an empty pipe calls nothing; a removed reader neither


def test_a_hang_up_is_readable_and_a_reader_removed_by_another_is_not_called(run: Runner[Any]) -> None:
    async def body() -> list[str]:
        watch = fd_watch(asyncio.get_running_loop())
        (r1, w1), (r2, w2) = _pipe(), _pipe()
        calls: list[str] = []

        def first(fd: int) -> None:
            calls.append(f"first {os.read(fd, 10)!r}")
            watch.remove(r1)
            watch.remove(r2)  # ready in the same turn: not called after this

        def second(fd: int) -> None:
            calls.append("second")
            watch.remove(r1)
            watch.remove(r2)

        watch.add(r1, first, r1)
        watch.add(r2, second, r2)
        os.close(w1)  # EOF: a hang-up, reported without EPOLLIN asked for it
        os.close(w2)
        await asyncio.sleep(0.02)
        os.close(r1)
        os.close(r2)
        return calls

    calls = run(body())
    assert calls in (["first b''"], ["second"])


def test_adding_again_replaces_the_reader_and_removing_a_closed_one_is_quiet(run: Runner[Any]) -> None:
    async def body() -> list[str]:
        watch = fd_watch(asyncio.get_running_loop())
        r, w = _pipe()
        calls: list[str] = []
        watch.add(r, lambda: calls.append("old"))
        watch.add(r, lambda: (calls.append("new"), os.read(r, 10)))
        os.write(w, b"x")
        await asyncio.sleep(0.02)
        os.close(r)
        watch.remove(r)  # closed already: EBADF is not an error here
        watch.remove(r)  # nor a second removal
        os.close(w)
        return calls

    assert run(body()) == ["new"]


def test_each_loop_has_its_own(run: Runner[Any]) -> None:
    async def body() -> int:
        return fd_watch(asyncio.get_running_loop()).fileno()

    other = asyncio.new_event_loop()
    try:
        theirs = other.run_until_complete(body())
        ours = run(body())
        assert theirs != ours
    finally:
        other.close()


def test_a_number_closed_without_remove_is_watched_when_given_again(run: Runner[Any]) -> None:
    # The kernel drops a closed descriptor from the epoll; the table still names its number. A new
    # pipe that gets the number must be watched all the same, or its output would never be read.
    async def body() -> list[bytes]:
        watch = fd_watch(asyncio.get_running_loop())
        r, w = _pipe()
        watch.add(r, lambda: None)
        os.close(r)  # no remove
        os.close(w)
        fresh, w2 = _pipe()
        if fresh != r:  # a new pipe under the number just closed (the lowest free one, most often)
            os.dup2(fresh, r)
            os.close(fresh)
        r2 = r
        got: list[bytes] = []
        try:
            watch.add(r2, lambda: got.append(os.read(r2, 10)))
            os.write(w2, b"late")
            await asyncio.sleep(0.02)
            return got
        finally:
            watch.remove(r2)
            os.close(r2)
            os.close(w2)

    assert run(body())[:1] == [b"late"]

