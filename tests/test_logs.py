"""The log handler's writes: lines kept while the loop runs and written together, in order; a
line at the end of its tick, an audit line (``linger``) within ``LINGER``; at once from another
thread or with no loop; what a stopped loop left, at ``flush`` (``logging.shutdown``)."""

from __future__ import annotations

import asyncio
import io
import threading

from smith_fast import logs


class Counting(io.StringIO):
    """A stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_audit_lines_linger_and_go_out_together_in_order() -> None:
    out = Counting()
    handler = logs.TickStreamHandler(out)

    async def main() -> None:
        for i in range(100):
            handler.add_line(f"info {i}\n", linger=True)
            await asyncio.sleep(0)  # a tick each: before, a write each
        assert out.getvalue() == "" and out.writes == 0
        await asyncio.sleep(logs.LINGER * 2)
        assert out.getvalue() == "".join(f"info {i}\n" for i in range(100))
        assert out.writes == 1

    asyncio.run(main())


def test_another_line_goes_out_at_the_end_of_its_tick_with_what_waited_before_it() -> None:
    out = Counting()
    handler = logs.TickStreamHandler(out)

    async def main() -> None:
        handler.add_line("info 1\n", linger=True)
        await asyncio.sleep(0)
        handler.add_line("warning\n")
        assert out.getvalue() == ""  # not inside the tick that emitted it
        await asyncio.sleep(0)
        assert out.getvalue() == "info 1\nwarning\n"
        handler.add_line("info 2\n", linger=True)  # after the warning's write: lingers again
        await asyncio.sleep(0)
        assert out.getvalue() == "info 1\nwarning\n"
        await asyncio.sleep(logs.LINGER * 2)
        assert out.getvalue() == "info 1\nwarning\ninfo 2\n" and out.writes == 2

    asyncio.run(main())


def test_many_waiting_lines_go_out_at_the_end_of_the_tick() -> None:
    out = Counting()
    handler = logs.TickStreamHandler(out)
    line = "x" * 999 + "\n"

    async def main() -> None:
        for _ in range(logs.LINGER_BYTES // len(line) + 1):
            handler.add_line(line, linger=True)
        await asyncio.sleep(0)
        assert len(out.getvalue()) > logs.LINGER_BYTES and out.writes == 1

    asyncio.run(main())


def test_other_threads_and_no_loop_write_at_once_after_what_was_kept() -> None:
    out = Counting()
    handler = logs.TickStreamHandler(out)
    handler.add_line("no loop\n")
    assert out.getvalue() == "no loop\n"

    async def main() -> None:
        handler.add_line("kept\n", linger=True)
        thread = threading.Thread(target=handler.add_line, args=("from a thread\n",))
        thread.start()
        thread.join()
        assert out.getvalue() == "no loop\nkept\nfrom a thread\n"

    asyncio.run(main())


def test_what_a_stopped_loop_left_is_written_by_flush_or_the_next_loop() -> None:
    out = Counting()
    handler = logs.TickStreamHandler(out)

    async def emit(line: str) -> None:
        handler.add_line(line, linger=True)

    asyncio.run(emit("left 1\n"))  # the loop ends before its LINGER
    assert out.getvalue() == ""
    asyncio.run(emit("second loop\n"))  # another loop: the first one's line first
    assert out.getvalue() == "left 1\n"
    handler.flush()  # what logging.shutdown does at exit
    assert out.getvalue() == "left 1\nsecond loop\n"
