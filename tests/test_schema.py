"""The schema contract: our proto is the user's schema plus documented additions, and the committed
generated code is exactly what the pinned grpcio-tools writes from it."""

from __future__ import annotations

import hashlib
import pathlib
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from smith_fast.pb import smith_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "proto" / "upstream" / "smith_v1.proto"
# SHA-256 of smith_v1.proto exactly as the user handed it over (computed from their file when it
# was vendored). The repository carries the copy and this digest, so the check needs nothing beside it.
USERS_SCHEMA_SHA256 = "b5cf9d5cb6fb2396882dcfb6efda04bfa6163c8b5d367c683a87d99a083fa006"
# The only additions allowed, as documented in PROTOCOL.md ("Envelope additions").
ADDED_ENVELOPE_FIELDS = {
    "batch_command": 12,
    "batch_event": 13,
    "health_check_request": 14,
    "health_check_response": 16,
    "metrics": 17,
    "resource_usage": 18,
}
# Process control (PROTOCOL.md, "Process control"): new members and fields with new numbers.
ADDED_FIELDS = {
    "smith.v1.Command.cancel": 7,
    "smith.v1.Command.stdin": 8,
    "smith.v1.Command.resize": 9,
    "smith.v1.ShellExecCommand.open_stdin": 7,
    "smith.v1.ShellExecCommand.pty": 8,
    "smith.v1.ShellExecCommand.binary_output": 9,
    "smith.v1.ShellOutputEvent.stdout_bytes": 6,
    "smith.v1.ShellOutputEvent.stderr_bytes": 7,
    "smith.v1.ShellOutputEvent.stdin_written": 8,
    # Background processes (PROTOCOL.md, "Background processes")
    "smith.v1.Command.list_processes": 10,
    "smith.v1.Command.attach": 11,
    "smith.v1.ShellExecCommand.background": 10,
    "smith.v1.ShellOutputEvent.offset": 9,
    "smith.v1.Event.process_list": 10,
    # Resume (PROTOCOL.md, "Resume")
    "smith.v1.HandshakeCommand.resume_token": 4,
    "smith.v1.HandshakeCommand.resume_after": 5,
    "smith.v1.ReadyEvent.resume_token": 5,
    "smith.v1.ReadyEvent.resumed": 6,
    # Workspaces (PROTOCOL.md, "Workspaces")
    "smith.v1.Capability.CAPABILITY_WORKSPACES": 7,
    "smith.v1.Command.checkpoint": 12,
    "smith.v1.Command.restore": 13,
    "smith.v1.Command.diff": 14,
    "smith.v1.Command.undo": 15,
    "smith.v1.Event.workspace": 11,
    "smith.v1.ShellOutputEvent.changes": 10,
    "smith.v1.ToolResultEvent.changes": 6,
}
ADDED_MESSAGES = ("PtyRequest", "CancelCommand", "StdinCommand", "ResizeCommand",
                  "ListProcessesCommand", "AttachCommand", "ProcessListEvent", "BackgroundProcess",
                  "CheckpointCommand", "RestoreCommand", "DiffCommand", "UndoCommand", "WorkspaceEvent", "FileChanges",
                  "FileChange", "ChangeKind")


def compile_descriptor(path: pathlib.Path) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "set.pb"
        rc = protoc.main(["protoc", f"-I{path.parent}", f"--descriptor_set_out={out}", str(path)])
        assert rc == 0, f"protoc failed on {path}"
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def flatten(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """Every message field and enum value, keyed by its full name."""
    items: dict[str, object] = {}

    def walk(msgs, prefix: str) -> None:  # type: ignore[no-untyped-def]
        for m in msgs:
            name = f"{prefix}.{m.name}"
            for f in m.field:
                items[f"{name}.{f.name}"] = (f.number, f.type, f.label, f.type_name, f.HasField("oneof_index"))
            for e in m.enum_type:
                for v in e.value:
                    items[f"{name}.{e.name}.{v.name}"] = v.number
            walk(m.nested_type, name)

    walk(fd.message_type, fd.package)
    for e in fd.enum_type:
        for v in e.value:
            items[f"{fd.package}.{e.name}.{v.name}"] = v.number
    for s in fd.service:
        for m in s.method:
            items[f"{fd.package}.{s.name}.{m.name}"] = (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
    return items


def test_vendored_upstream_is_the_users_schema() -> None:
    # The vendored copy is the contract: byte for byte the user's file, never edited (additions go
    # in proto/smith/v1/smith.proto).
    digest = hashlib.sha256(UPSTREAM.read_bytes()).hexdigest()
    assert digest == USERS_SCHEMA_SHA256, f"{UPSTREAM} is no longer the user's schema (sha256 {digest})"


def test_schema_is_upstream_plus_documented_additions() -> None:
    ours = flatten(compile_descriptor(ROOT / "proto" / "smith" / "v1" / "smith.proto"))
    theirs = flatten(compile_descriptor(UPSTREAM))
    for name, spec in theirs.items():
        assert ours.get(name) == spec, f"{name} changed: {spec} -> {ours.get(name)}"
    added = {name: spec for name, spec in ours.items() if name not in theirs}
    new_messages = {name for name in added if name.split(".")[2] in ADDED_MESSAGES}
    assert set(added) - new_messages == {f"smith.v1.Envelope.{n}" for n in ADDED_ENVELOPE_FIELDS} | set(ADDED_FIELDS)
    for name, number in ADDED_FIELDS.items():
        spec = added[name]
        assert (spec if isinstance(spec, int) else spec[0]) == number  # type: ignore[index]  # an enum value, or a field's (number, ...)
    for field, number in ADDED_ENVELOPE_FIELDS.items():
        assert added[f"smith.v1.Envelope.{field}"][0] == number  # type: ignore[index]
    # 4 and 15 stay unused: their tags would make a v1 stream look like JSON (PROTOCOL.md, "Telling v0 from v1")
    used = {f.number for f in smith_pb2.Envelope.DESCRIPTOR.fields}
    assert not used & {4, 15}


def test_envelope_tags_never_look_like_jsonl() -> None:
    # The byte after a one-byte length prefix of 123 ("{") is the first field's tag; it must never be
    # a byte that can follow "{" in JSON.
    json_second_bytes = {ord(c) for c in '"} \t\r\n'}
    for f in smith_pb2.Envelope.DESCRIPTOR.fields:
        wire_type = 2 if f.type == f.TYPE_MESSAGE else 0
        tag = (f.number << 3) | wire_type
        assert tag >= 0x80 or tag not in json_second_bytes, f.name


def test_generated_code_is_up_to_date(tmp_path: pathlib.Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    assert {p.name for p in written} == {"smith_pb2.py", "smith_pb2.pyi", "smith_pb2_grpc.py"}
    for path in written:
        committed = ROOT / "smith_fast" / "pb" / path.name
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run python proto/generate.py"
