"""The size ``--max-command-size`` limits, and the error for a command over it.

Measured before anything runs (and again after hooks transformed the command), so an oversize
command never reaches a hook or a shell. Which size a command kind has is a column of the command
table (:mod:`~smith_fast.service.commands`).
"""

from __future__ import annotations

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb

__all__ = ["command_size", "tool_call_size", "plan_size", "terminal_size", "too_large"]


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def command_size(cmd: pb.ShellExecCommand) -> int:
    """Bytes a ShellExec asks the service to hand to ``exec``: the command string plus its env
    (``NAME=value`` entries), in UTF-8."""
    size = _text_size(cmd.command)
    env = cmd.env
    if env:  # the runtime's items() is a Python-level view: ~0.5 µs on every command, even empty
        for name, value in env.items():
            size += _text_size(name) + _text_size(value) + 2
    return size


def tool_call_size(cmd: pb.ToolCallCommand) -> int:
    """A ToolCall's ``args``, in bytes."""
    return len(cmd.args)


def plan_size(cmd: pb.PlanCommand) -> int:
    """A PlanCommand's goal plus its context entries, in UTF-8."""
    return _text_size(cmd.goal) + sum(_text_size(k) + _text_size(v) for k, v in cmd.context.items())


def too_large(what: str, size: int, limit: int, rid: str | None) -> ProtocolError:
    """The error for a command over ``--max-command-size``: ``ERROR_CODE_RESOURCE_EXHAUSTED``."""
    return ProtocolError(
        f"{what} is {size} bytes, over the limit of {limit} (--max-command-size); nothing was run",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
        rid,
        {"reason": "too_large", "size": str(size), "limit": str(limit)},
    )


_MAX_TERMINAL = 0xFFFF  # rows and cols are 16-bit in the kernel's winsize


def terminal_size(rows: int, cols: int, rid: str) -> tuple[int, int]:
    """A PtyRequest's or ResizeCommand's size: 0 means 24 rows or 80 columns."""
    rows, cols = rows or 24, cols or 80
    if rows > _MAX_TERMINAL or cols > _MAX_TERMINAL:
        raise ProtocolError(f"terminal size {rows}x{cols} is too large (max {_MAX_TERMINAL})", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "invalid_field"})
    return rows, cols
