"""A normal build must load every compiled twin; SMITH_FAST_NO_EXTENSIONS=1 must force the Python ones."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from types import ModuleType

import pytest

from smith_fast._compat import COMPILED_IN_PLACE, NO_EXTENSIONS, SourceFirst, compiled, source_stamp, source_sum

FACADES = ["framing", "chunking", "sequencing", "coalescing", "events", "relaypeek"]


@pytest.mark.parametrize("name", FACADES)
def test_facade_uses_compiled_twin_in_normal_build(name: str) -> None:
    facade = importlib.import_module(f"smith_fast.{name}")
    expected = "py" if NO_EXTENSIONS else "c"
    assert facade.IMPLEMENTATION == expected, (
        f"smith_fast.{name} runs the {facade.IMPLEMENTATION!r} twin; the build did not install "
        "the compiled extension (set SMITH_FAST_NO_EXTENSIONS=1 only on purpose)"
    )
    if not NO_EXTENSIONS:
        compiled = importlib.import_module(f"smith_fast._{name}_c")
        assert compiled.__file__.endswith((".so", ".pyd")), compiled.__file__


@pytest.mark.parametrize("name", FACADES)
def test_env_var_forces_python_twins(name: str) -> None:
    env = dict(os.environ, SMITH_FAST_NO_EXTENSIONS="1")
    code = f"import smith_fast.{name} as m; print(m.IMPLEMENTATION)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "py"


@pytest.mark.parametrize("name", sorted(COMPILED_IN_PLACE))
def test_the_request_path_runs_compiled_in_a_normal_build(name: str) -> None:
    module = importlib.import_module(name)
    assert compiled(module) != NO_EXTENSIONS, (
        f"{name} runs from {module.__file__}; the build did not compile it (make install), or its source changed since"
    )


def test_env_var_runs_the_request_path_from_its_source() -> None:
    env = dict(os.environ, SMITH_FAST_NO_EXTENSIONS="1")
    code = ("import importlib, smith_fast._compat as c; "
            "print(sorted(n for n in c.COMPILED_IN_PLACE if c.compiled(importlib.import_module(n))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_extension_built_from_another_source_is_not_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An edit (or a checkout) after the build: the source is what runs, never the stale extension."""
    from importlib.machinery import SourceFileLoader

    source = tmp_path / "logs.py"
    source.write_text("built = True\n")
    monkeypatch.setattr(SourceFirst, "built", {"smith_fast.logs": [source_sum(str(source))]})
    # as built: the usual finders take the extension (with extensions off: the source)
    assert (SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)]) is None) != NO_EXTENSIONS
    source.write_text("built = False\n")
    spec = SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)])
    assert spec is not None and isinstance(spec.loader, SourceFileLoader) and spec.origin == str(source)
    monkeypatch.setattr(SourceFirst, "built", {})  # no sums: nothing was built in place
    assert SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)]) is not None
    assert SourceFirst.find_spec("smith_fast.framing", [str(tmp_path)]) is None  # not compiled in place


def test_a_source_with_its_build_stamp_is_not_read_and_one_without_is_summed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The size and mtime the build noted spare the start reading the source; a source whose
    times changed (a wheel's, unpacked after its extension) is summed, and runs compiled only when
    its CRC is the build's; an edit runs from the source."""
    from importlib.machinery import SourceFileLoader

    source = tmp_path / "logs.py"
    source.write_text("built = True\n")
    crc = source_sum(str(source))
    monkeypatch.setattr(SourceFirst, "built", {"smith_fast.logs": [crc, source_stamp(str(source))]})
    monkeypatch.setattr("smith_fast._compat.source_sum", lambda path: pytest.fail(f"{path} was read"))
    # (with extensions off: the source, and nothing summed either)
    assert (SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)]) is None) != NO_EXTENSIONS  # the stamp: not read
    monkeypatch.undo()
    monkeypatch.setattr(SourceFirst, "built", {"smith_fast.logs": [crc, source_stamp(str(source))]})
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))  # unpacked later: other times, the same bytes
    assert (SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)]) is None) != NO_EXTENSIONS
    source.write_text("built = False\n")  # an edit
    spec = SourceFirst.find_spec("smith_fast.logs", [str(tmp_path)])
    assert spec is not None and isinstance(spec.loader, SourceFileLoader) and spec.origin == str(source)


def test_compile_failure_fails_loudly_naming_the_escape_hatch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A broken compiler must fail the build (never install the slow path silently) and say what to do."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, CC="/bin/false", SMITH_FAST_EXTENSIONS="_framing_c")
    env.pop("SMITH_FAST_NO_EXTENSIONS", None)
    res = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp"), "--force"],
        cwd=root, env=env, capture_output=True, text=True,
    )
    assert res.returncode != 0
    assert "SMITH_FAST_NO_EXTENSIONS=1" in res.stderr + res.stdout
    assert not list((tmp_path / "lib").rglob("*.so"))


def test_an_augmenting_pxd_declares_exactly_the_slots_of_its_classes() -> None:
    """A class a ``.pxd`` beside a module compiled in place makes an extension type keeps its fields
    in the C struct the ``.pxd`` declares: those must be the ``__slots__`` of the class as its
    ``.py`` says (a slot missing there would work from the source and fail compiled)."""
    checked = 0
    for name in sorted(COMPILED_IN_PLACE):
        package, _, leaf = name.rpartition(".")
        pxd = pathlib.Path(importlib.import_module(package).__file__ or "").parent / f"{leaf}.pxd"
        if not pxd.exists():
            continue
        source = _source_module(name)
        for cls, body in re.findall(r"^cdef class (\w+):\n((?:    .*\n?)+)", pxd.read_text(), re.M):
            declared = set(re.findall(r"\b(\w+)\b", " ".join(
                line.split("object", 1)[-1] if "object" in line else line.split()[-1]
                for line in body.splitlines() if line.strip().startswith("cdef public")
            )))
            assert declared == set(getattr(source, cls).__slots__), f"{pxd.name}: {cls}"
            checked += 1
    assert checked >= 1


def _source_module(name: str) -> ModuleType:
    """Module ``name`` run from its ``.py``, beside whatever this run imported (its own copy)."""
    package, _, leaf = name.rpartition(".")
    path = pathlib.Path(importlib.import_module(package).__file__ or "").parent / f"{leaf}.py"
    spec = importlib.util.spec_from_file_location(f"{package}._{leaf}_source", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module
