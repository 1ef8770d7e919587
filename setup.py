"""Build the Cython hot paths in ``csrc/`` as ``smith_fast._<name>_c`` extension modules.

Every ``csrc/*.pyx`` (hand-written kernels) and every ``csrc/*_c.py`` (a pure-Python twin compiled
as-is, typed by the ``.pxd`` beside it) becomes an extension. ``SMITH_FAST_NO_EXTENSIONS=1`` builds
none of them and installs the pure-Python twins only. Without it, a compile failure fails the build:
the slow path is never installed by accident.
"""

from __future__ import annotations

import os
import pathlib
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
NO_EXTENSIONS = os.environ.get("SMITH_FAST_NO_EXTENSIONS", "") not in ("", "0")

HINT = (
    "smith-fast: building the Cython extensions failed ({error}).\n"
    "Install a C compiler, the Python headers and Cython, or set SMITH_FAST_NO_EXTENSIONS=1 "
    "to build and run the pure-Python twins only (several times slower)."
)


class LoudBuildExt(build_ext):
    """``build_ext`` that turns any compiler failure into one clear message naming the escape hatch."""

    def run(self) -> None:
        try:
            super().run()
            self.build_sandbox_helper()
        except Exception as exc:  # distutils raises a zoo of types; the message is what matters
            raise SystemExit(HINT.format(error=exc)) from exc

    def build_sandbox_helper(self) -> None:
        """``csrc/sandbox_exec.c`` → ``smith_fast/sandbox/sandbox-exec``: the exec wrapper in C, which
        starts a sandboxed command some 30x faster than the Python one (which stays the fallback)."""
        if self.compiler is None or sys.platform != "linux":
            return
        out_dir = HERE / "smith_fast" / "sandbox" if self.inplace else pathlib.Path(self.build_lib) / "smith_fast" / "sandbox"
        out_dir.mkdir(parents=True, exist_ok=True)
        objects = self.compiler.compile(["csrc/sandbox_exec.c"], output_dir=self.build_temp, extra_postargs=["-O2"])
        self.compiler.link_executable(objects, "sandbox-exec", output_dir=str(out_dir))

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            raise SystemExit(HINT.format(error=f"{ext.name}: {exc}")) from exc


def extensions() -> list:
    if NO_EXTENSIONS:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        raise SystemExit(HINT.format(error="Cython is not installed")) from exc
    from setuptools import Extension

    sources = sorted(HERE.glob("csrc/*.pyx")) + sorted(HERE.glob("csrc/*_c.py"))
    # Developer knob: SMITH_FAST_EXTENSIONS=_framing_c,_chunking_c rebuilds just those.
    only = {name for name in os.environ.get("SMITH_FAST_EXTENSIONS", "").split(",") if name}
    if only:
        sources = [src for src in sources if src.stem in only]
    exts = [
        Extension(
            f"smith_fast.{src.stem}",
            [str(src.relative_to(HERE))],
            extra_compile_args=["-O3"] if sys.platform != "win32" else [],
        )
        for src in sources
    ]
    # Plain C (no Cython): the sandboxed spawn that applies Landlock between clone and exec
    # (csrc/sandbox_spawn.c; smith_fast/sandbox/spawner.py falls back to the exec wrapper without it).
    plain = [] if only and "_spawn_c" not in only else [
        Extension("smith_fast._spawn_c", ["csrc/sandbox_spawn.c"], include_dirs=["csrc"],
                  extra_compile_args=["-O2"] if sys.platform != "win32" else [])
    ]
    return plain + cythonize(
        exts,
        include_path=["csrc"],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
        },
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": LoudBuildExt})
