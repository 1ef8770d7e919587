"""One exception hierarchy, in one module, reachable from the package's face.

Every public exception class of ``smith_fast/`` is defined in ``smith_fast/errors.py`` (found from
the source, so a new one elsewhere fails here); the modules that first defined them still export
the same objects; ``import smith_fast`` gives the errors, the client (imported only when asked for)
and the version.
"""

from __future__ import annotations

import ast
import builtins
import pickle
import subprocess
import sys

from smith_fast import errors
from smith_fast.pb import smith_pb2 as pb
from tests.test_import_cycles import PACKAGE, ROOT

# Modules whose exceptions their own change moves into errors.py (the client, the NATS gateway,
# the HTTP fronts); this set only shrinks.
NOT_MOVED_YET = {"mcp/http_head.py", "plan/http.py"}


def exception_classes() -> dict[str, list[str]]:
    """``{path under smith_fast/: [names of the exception classes it defines]}``, from the source:
    a class is one when a base is a built-in exception or a class already known to be one."""
    trees = {path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
             for path in sorted(PACKAGE.rglob("*.py")) if "pb" not in path.relative_to(PACKAGE).parts}
    known = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)
             and issubclass(getattr(builtins, name), BaseException)}
    found: dict[str, list[str]] = {}
    grew = True
    while grew:
        grew = False
        for path, tree in trees.items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name in found.get(path, []):
                    continue
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
                if bases & known:
                    found.setdefault(path, []).append(node.name)
                    known.add(node.name)
                    grew = True
    return found


def test_every_public_exception_is_defined_in_errors_py() -> None:
    found = exception_classes()
    assert set(errors.__all__) == set(found["errors.py"])
    elsewhere = {
        f"smith_fast/{path}: {name}"
        for path, names in found.items()
        for name in names
        if path != "errors.py" and not name.startswith("_") and path not in NOT_MOVED_YET
    }
    assert not elsewhere, "define these in smith_fast/errors.py (import them back where they were):\n" + "\n".join(sorted(elsewhere))


def test_every_error_is_a_smith_fast_error() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SmithFastError), name


def test_the_old_names_are_the_same_classes() -> None:
    from smith_fast.hooks import HookFailure, HookLoadError
    from smith_fast.plan.model import PlanError
    from smith_fast.replay.format import LogFormatError
    from smith_fast.sandbox import SandboxUnavailable, UnsafeRoot
    from smith_fast.service.lifecycle import StartupError
    from smith_fast.service.resume import ResumeRefused
    from smith_fast.tools.schema import ArgumentError

    moved = (HookFailure, HookLoadError, PlanError, LogFormatError, SandboxUnavailable, UnsafeRoot, StartupError,
             ResumeRefused, ArgumentError)
    assert all(cls is getattr(errors, cls.__name__) for cls in moved)
    assert issubclass(errors.LandlockError, OSError) and issubclass(errors.UnsafeRoot, errors.SandboxError)


def test_codes_default_to_the_schema_values() -> None:
    # errors.py does not import the schema for two defaults; these are its numbers.
    assert errors.PlanError("x").code == pb.ERROR_CODE_UNSPECIFIED
    assert errors.ResumeRefused("x", "resume_unknown").code == pb.ERROR_CODE_PERMISSION_DENIED


def test_the_moved_errors_survive_pickling() -> None:
    plan = errors.PlanError("bad step", "invalid_plan", code=pb.ERROR_CODE_RESOURCE_EXHAUSTED, details={"step": "s1"})
    plan.request_id = "r1"
    plan.usage = ("any", "value")
    back = pickle.loads(pickle.dumps(plan))
    assert (back.args, back.reason, back.code, back.details, back.request_id, back.usage) == (
        plan.args, "invalid_plan", pb.ERROR_CODE_RESOURCE_EXHAUSTED, {"reason": "invalid_plan", "step": "s1"}, "r1", plan.usage
    )
    for exc in (errors.ArgumentError("bad", "$.x"), errors.HookLoadError("no", "diag"), errors.HookFailure("h", "t", "r")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and again.args == exc.args


def test_the_package_exports_the_errors_the_client_and_the_version() -> None:
    import smith_fast
    from smith_fast import client

    assert smith_fast.__version__ == "0.1.0"
    assert smith_fast.Client is client.Client and smith_fast.GrpcClient is client.GrpcClient
    assert smith_fast.SmithError is client.SmithError
    assert all(getattr(smith_fast, name) is getattr(errors, name) for name in errors.__all__)
    assert set(errors.__all__) <= set(smith_fast.__all__)
    assert all(hasattr(smith_fast, name) for name in smith_fast.__all__)


def test_import_smith_fast_leaves_the_client_until_asked() -> None:
    code = (
        "import sys, smith_fast\n"
        "assert 'smith_fast.client' not in sys.modules and 'google.protobuf' not in sys.modules, sorted(sys.modules)\n"
        "smith_fast.Client\n"
        "assert 'smith_fast.client' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
