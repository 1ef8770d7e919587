"""The local terminal of ``smith-fast exec -t``: raw mode that is always undone, and its size.

As ``ssh -t`` and ``docker exec -it`` do: while a remote command runs on a pseudo-terminal, the
local one passes every key through untouched (Ctrl-C is the byte ``\\x03``, not SIGINT here), and
its settings come back on every way out (normal exit, an error, a signal that ends us).
"""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Iterator

__all__ = ["raw_mode", "window_size"]

DEFAULT_SIZE = (24, 80)


def window_size(*fds: int) -> tuple[int, int]:
    """``(rows, cols)`` of the first of ``fds`` that is a terminal, else 24x80."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines and size.columns:
            return size.lines, size.columns
    return DEFAULT_SIZE


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[bool]:
    """Put terminal ``fd`` in raw mode for the block; yields False (and does nothing) if it is no terminal.

    The saved settings are put back when the block ends however it ends (``TCSADRAIN``: after what
    was written to the terminal went out).
    """
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        yield False
        return
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield True
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
