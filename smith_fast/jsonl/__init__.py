"""The v0 wire format: JSON Lines, byte-compatible with the Rust ``smith-protocol`` crate (0.1.x).

One JSON object per line, ``\\n``-terminated, adjacently tagged: ``{"type":"<Variant>","data":{...}}``
with PascalCase variants, snake_case fields in the crate's declaration order, and a unit variant
without ``data`` (``{"type":"Shutdown"}``). ``JsonlCodec`` converts between those lines and the v1
``Command``/``Event`` messages, so the service and the SDK speak v1 internally whatever the peer
speaks (PROTOCOL.md, "v0: JSON lines"). ``LineDecoder`` cuts the byte stream into lines;
unlike the v1 ``FrameDecoder`` its errors are not sticky, as a v0 stream resynchronizes at the next
newline. The hot events also have direct encoders (``JsonlCodec.shell_output`` and friends) that
take plain Python values and write the same bytes as ``encode_event``.

Output is what the crate's serde writes: compact (``separators=(",", ":")``), non-ASCII kept as
UTF-8, ``null`` for absent optionals, maps always present (``{}`` when empty), enums as strings.
Fields that v0 lacks are dropped when encoding and left at their defaults when decoding:
``Handshake.client_info``, ``Ready.service_info``, ``Log.fields``, ``TokenUsage.model``,
``ToolResult.duration_ms`` and ``Error.details`` (v0 ``Error`` is
``{request_id, error_code, message, timestamp}``).

Decisions, each made to match a Rust peer or to keep the two JSON backends byte-identical:

* Ids (``request_id``, ``service_id``, node and edge ids) must be UUIDs in a form the ``uuid``
  crate parses (hyphenated, simple, braced or ``urn:uuid:``, any case); they are decoded to the
  lowercase hyphenated form the crate prints. Encoding does not validate ids.
* ``ToolCall.args``, ``ToolResult.result`` and the hook action data are JSON values in v0 and UTF-8
  JSON in v1 ``bytes``. Decoding serializes the value compactly; encoding parses the bytes. Empty
  bytes encode as ``null``; bytes that are not JSON a v0 peer accepts (invalid JSON, or nested too
  deep) are sent as a JSON *string* holding their text (invalid UTF-8 replaced by U+FFFD), so a
  result is never lost because a tool returned plain text.
* Nesting is limited to ``MAX_NESTING`` (127) levels of arrays/objects per line, the limit of
  ``serde_json``: a deeper line is an ``invalid_json`` error, never a ``RecursionError``.
* ``error_code`` is a free string in v0: a name other than an ``ErrorCode`` (minus ``ERROR_CODE_``)
  decodes as ``ERROR_CODE_UNSPECIFIED`` with the name in ``details["v0_error_code"]``, and such an
  event encodes that name back.
* Missing or ``null`` maps and lists decode as empty; missing optional fields as absent. A missing
  required field is an error. Unknown fields are ignored.
* Unknown capability names do not fail a handshake: the known ones are decoded, and
  :class:`~smith_fast.errors.ProtocolError` (``ERROR_CODE_INVALID_CAPABILITY``) is raised with the
  decoded message on its ``command`` (or ``event``) attribute and the names in
  ``details["unknown_capabilities"]`` (comma-separated), so the caller can report them and go on.
* Every other malformed line raises ``ProtocolError`` with ``ERROR_CODE_UNSPECIFIED``: the schema
  has no code for malformed input. ``details["reason"]`` says which kind: ``invalid_utf8``,
  ``invalid_json``, ``malformed``, ``unknown_command``/``unknown_event``, ``invalid_field`` or
  ``invalid_uuid``.
* Both backends (stdlib ``json`` and ``orjson``) accept the same lines and write the same bytes:
  the stdlib one rejects ``NaN``/``Infinity`` and lone surrogates as orjson does, reads integers
  beyond 64 bits as floats as orjson does, and prints floats in orjson's notation (``1e-7``,
  ``0.00001``; checked against orjson 3.13). Only the parser's wording of an ``invalid_json``
  message differs; its position is a character index into the line.
"""

from __future__ import annotations

from ._backends import MAX_NESTING
from ._codec import JsonlCodec
from ._lines import DEFAULT_MAX_LINE_SIZE, LineDecoder

__all__ = ["DEFAULT_MAX_LINE_SIZE", "MAX_NESTING", "JsonlCodec", "LineDecoder"]
