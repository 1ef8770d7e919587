"""A normal build must load every compiled twin; SMITH_FAST_NO_EXTENSIONS=1 must force the Python ones."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from smith_fast._compat import NO_EXTENSIONS

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
