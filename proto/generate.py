"""Regenerate the protobuf and gRPC Python modules in ``smith_fast/pb`` from ``proto/``.

Usage: ``python proto/generate.py [OUT_DIR]`` (default: ``smith_fast/pb``). The generated files are
committed; ``tests/test_schema.py`` runs this into a temporary directory and fails if the output
differs from what is committed, so the schema and the code cannot drift apart.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
SCHEMA = "smith/v1/smith.proto"
DEFAULT_OUT = HERE.parent / "smith_fast" / "pb"
# grpc's plugin imports the messages module by its proto path ("from smith.v1 import smith_pb2");
# inside our package that must be a relative import.
_ABSOLUTE_IMPORT = "from smith.v1 import smith_pb2 as smith_dot_v1_dot_smith__pb2"
_RELATIVE_IMPORT = "from . import smith_pb2 as smith_dot_v1_dot_smith__pb2"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc into ``out_dir`` and return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(
            [
                "protoc",
                f"-I{HERE}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(HERE / SCHEMA),
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        written = []
        for src in sorted((pathlib.Path(tmp) / "smith" / "v1").iterdir()):
            text = src.read_text()
            if src.name == "smith_pb2_grpc.py":
                if _ABSOLUTE_IMPORT not in text:
                    raise SystemExit("unexpected grpc plugin output: message import not found")
                text = text.replace(_ABSOLUTE_IMPORT, _RELATIVE_IMPORT)
            dest = out_dir / src.name
            dest.write_text(text)
            written.append(dest)
    return written


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(target):
        print(path)
