"""What a relayed frame starts and ends: the compiled twin when available, else the pure-Python one.

The NATS gateway relays bytes without decoding them; these tell it, cheaply, which request ids a
frontend's frame starts, which ended in what the session wrote, and the last sequence it sent, so
that when its worker is gone it can end every open request once. See ``smith_fast._relaypeek_py``
for the v1 API documentation (both twins share it) and ``smith_fast._relaypeek_v0`` for v0 lines.

:func:`tool_call` reads the commonest frame a session gets, a plain tool call, without the protobuf
runtime (service/session.py's quick path); the session uses it only when it is compiled
(:data:`IMPLEMENTATION` ``"c"``): the Python twin's walk costs more than the runtime's decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ._compat import NO_EXTENSIONS
from ._relaypeek_py import ToolCall
from ._relaypeek_v0 import v0_command_ids, v0_event_marks

IMPLEMENTATION: Literal["c", "py"]

# As in framing.py: a type checker sees the Python twin's typed API; at run time the compiled twin
# is the choice unless it is missing or turned off.
if not TYPE_CHECKING and not NO_EXTENSIONS:
    try:
        from ._relaypeek_c import batch_size, command_ids, event_marks, tool_call

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if TYPE_CHECKING or NO_EXTENSIONS:
    from ._relaypeek_py import batch_size, command_ids, event_marks, tool_call  # noqa: F401

    IMPLEMENTATION = "py"

__all__ = [
    "IMPLEMENTATION", "ToolCall", "batch_size", "command_ids", "event_marks", "tool_call", "v0_command_ids", "v0_event_marks",
]
