"""Fuzz the hot v1 event encoders (the service's outbound envelopes), both twins against protobuf.

The input drives ``atheris.FuzzedDataProvider``: which encoder, then each argument, mostly valid
values (any unicode, any uint64/int32, maps of any size) but also the wrong type or out of range,
lone surrogates, mapping proxies and memoryviews.

Checked on every input: both twins return the same bytes or raise the same exception class with the
same message; only ``TypeError``/``EncodeError`` are raised; what encodes is one delimited frame (or
the bare message with ``framed=False``) whose ``Envelope`` is byte for byte what the protobuf runtime
serializes (``deterministic=True``) for the same values.
"""

from __future__ import annotations

import types
from typing import Any

import atheris

from fuzz._common import assert_same, fuzz_main, instrumented, outcome, twins

with instrumented(__name__):
    c, py = twins("events")
    from smith_fast._framing_py import encode_frame, encode_varint
    from smith_fast.errors import EncodeError
    from smith_fast.pb import smith_pb2 as pb

_U64_EDGES = (0, 1, 127, 128, 16383, 16384, (1 << 32) - 1, 1 << 32, (1 << 56) - 1, 1 << 56, (1 << 63), (1 << 64) - 1)
_I32_EDGES = (0, 1, -1, 127, 128, -128, (1 << 31) - 1, -(1 << 31))
_BAD_VALUES: tuple[Any, ...] = (None, 1.5, "7", b"x", True, [], -1, 1 << 64, 1 << 31, -(1 << 31) - 1, "\ud800")


def _u64(fdp: atheris.FuzzedDataProvider) -> Any:
    mode = fdp.ConsumeIntInRange(0, 15)
    if mode == 0:
        return fdp.PickValueInList(list(_BAD_VALUES))
    if mode < 4:
        return fdp.PickValueInList(list(_U64_EDGES))
    return fdp.ConsumeIntInRange(0, (1 << 64) - 1)


def _i32(fdp: atheris.FuzzedDataProvider) -> Any:
    mode = fdp.ConsumeIntInRange(0, 15)
    if mode == 0:
        return fdp.PickValueInList(list(_BAD_VALUES))
    if mode < 4:
        return fdp.PickValueInList(list(_I32_EDGES))
    return fdp.ConsumeIntInRange(-(1 << 31), (1 << 31) - 1)


def _text(fdp: atheris.FuzzedDataProvider, optional: bool = False) -> Any:
    mode = fdp.ConsumeIntInRange(0, 31)
    if mode == 0:
        return fdp.PickValueInList(list(_BAD_VALUES))
    if optional and mode < 6:
        return None
    return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 300))  # may hold lone surrogates: EncodeError


def _map(fdp: atheris.FuzzedDataProvider) -> Any:
    mode = fdp.ConsumeIntInRange(0, 15)
    if mode == 0:
        return fdp.PickValueInList(list(_BAD_VALUES))
    if mode < 3:
        return None
    items = {}
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        key = _text(fdp)
        items[key if type(key) is not list else "list"] = _text(fdp)
    return types.MappingProxyType(items) if mode == 3 else items


def _blob(fdp: atheris.FuzzedDataProvider) -> Any:
    mode = fdp.ConsumeIntInRange(0, 15)
    if mode == 0:
        return fdp.PickValueInList(list(_BAD_VALUES))
    data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 400))
    return memoryview(data) if mode == 1 else bytearray(data) if mode == 2 else data


def _arguments(fdp: atheris.FuzzedDataProvider) -> tuple[str, tuple[Any, ...]]:
    which = fdp.ConsumeIntInRange(0, 5)
    ts, seq = _u64(fdp), _u64(fdp)
    if which == 0:
        return "encode_shell_output", (
            ts, seq, _text(fdp), _text(fdp, True), _text(fdp, True),
            None if fdp.ConsumeBool() else _i32(fdp), fdp.ConsumeBool(),
        )  # fmt: skip
    if which == 1:
        return "encode_log", (ts, seq, _i32(fdp), _text(fdp), _u64(fdp), _text(fdp, True), _map(fdp))
    if which == 2:
        return "encode_state_change", (ts, seq, _i32(fdp), _text(fdp, True), _u64(fdp))
    if which == 3:
        return "encode_tool_result", (ts, seq, _text(fdp), fdp.ConsumeBool(), _blob(fdp), _text(fdp, True), _u64(fdp))
    if which == 4:
        return "encode_error", (ts, seq, _i32(fdp), _text(fdp), _text(fdp, True), _u64(fdp), _map(fdp))
    field = fdp.PickValueInList([10, 11, 12, 13, 14, 16, 17, 18, 15, 4, 0, 19, -1, 1 << 70, None])
    return "encode_envelope", (ts, seq, field, _blob(fdp))


def _expected(name: str, args: tuple[Any, ...]) -> bytes:
    """What the protobuf runtime serializes for the same values."""
    flags = {"encode_shell_output": 6, "encode_tool_result": 3}.get(name)
    # The encoders take any integer (operator.index), True included; the runtime wants a real int.
    args = tuple(int(a) if type(a) is bool and i != flags else a for i, a in enumerate(args))
    env = pb.Envelope(timestamp=args[0], sequence=args[1])
    if name == "encode_envelope":
        # The payload is carried verbatim (it need not even parse): the runtime's header, then it.
        payload = bytes(args[3])
        tag = encode_varint(args[2] << 3 | 2)
        return env.SerializeToString() + tag + encode_varint(len(payload)) + payload
    if name == "encode_shell_output":
        m = env.event.shell_output
        m.SetInParent()
        m.request_id = args[2]
        for field, value in (("stdout", args[3]), ("stderr", args[4]), ("exit_code", args[5])):
            if value is not None:
                setattr(m, field, value)
        m.finished = args[6]
    elif name == "encode_log":
        m = env.event.log
        m.SetInParent()
        m.level, m.message, m.timestamp = args[2], args[3], args[4]
        if args[5] is not None:
            m.request_id = args[5]
        m.fields.update(args[6] or {})
    elif name == "encode_state_change":
        m = env.event.state_change
        m.SetInParent()
        m.state, m.timestamp = args[2], args[4]
        if args[3] is not None:
            m.request_id = args[3]
    elif name == "encode_tool_result":
        m = env.event.tool_result
        m.SetInParent()
        m.request_id, m.success, m.result, m.duration_ms = args[2], args[3], bytes(args[4]), args[6]
        if args[5] is not None:
            m.error = args[5]
    else:
        m = env.event.error
        m.SetInParent()
        m.error_code, m.message, m.timestamp = args[2], args[3], args[5]
        if args[4] is not None:
            m.request_id = args[4]
        m.details.update(args[6] or {})
    return env.SerializeToString(deterministic=True)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    name, args = _arguments(fdp)
    framed = fdp.ConsumeBool()
    rc = outcome(getattr(c, name), *args, framed=framed)
    rp = outcome(getattr(py, name), *args, framed=framed)
    assert_same(rc, rp, f"{name}{args!r:.600}")
    if rc[0] == "err":
        assert rc[1] in (TypeError, EncodeError), f"{name} raised {rc[1].__name__}: {rc[2]}"
        return
    out = rc[1]
    assert type(out) is bytes
    if framed:
        bare = getattr(py, name)(*args, framed=False)
        assert out == encode_frame(bare), "a framed envelope is the bare one behind its length"
        body = bare
    else:
        body = out
    assert body == _expected(name, args), f"{name}: bytes differ from the protobuf runtime's"


if __name__ == "__main__":
    fuzz_main(test_one_input)
