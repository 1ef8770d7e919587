"""Build the Cython hot paths in ``csrc/`` as ``smith_fast._<name>_c`` extension modules.

Every ``csrc/*.pyx`` (hand-written kernels) and every ``csrc/*_c.py`` (a pure-Python twin compiled
as-is, typed by the ``.pxd`` beside it) becomes an extension; so does every module of
``smith_fast._compat.COMPILED_IN_PLACE`` (the per-request path of a call), compiled unchanged into
an extension of its own name beside its ``.py``. ``SMITH_FAST_NO_EXTENSIONS=1`` builds none of them
and installs the pure-Python twins only. Without it, a compile failure fails the build:
the slow path is never installed by accident.
"""

from __future__ import annotations

import os
import pathlib
import sys

from setuptools import Distribution, setup
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

    def finalize_options(self) -> None:
        super().finalize_options()
        # Some twenty-five extensions, most of them the request path's plain Python compiled
        # (COMPILED_IN_PLACE): one compiler per core unless -j said otherwise (pip asks nothing).
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # distutils raises a zoo of types; the message is what matters
            raise SystemExit(HINT.format(error=exc)) from exc
        self.note_sums()
        try:
            self.build_sandbox_helper()
        except Exception as exc:
            if not NO_EXTENSIONS:
                raise SystemExit(HINT.format(error=f"the sandbox program csrc/sandbox_exec.c: {exc}")) from exc
            # A pure build is for machines without a compiler: it installs, and the service then
            # refuses to start with a sandbox and says why (--sandbox off --network on still runs).
            print(f"smith-fast: the sandbox program was not built ({exc}); `serve` will need --sandbox off --network on",
                  file=sys.stderr)

    def note_sums(self) -> None:
        """The CRC-32 (and size and mtime) of each source compiled in place, in ``smith_fast/_in_place.sums``: the
        module runs compiled only while its ``.py`` is the source its extension was built from
        (``smith_fast._compat.SourceFirst``). A partial build (``SMITH_FAST_EXTENSIONS``) keeps the
        other modules' lines."""
        compat = _compat()
        out = (HERE if self.inplace else pathlib.Path(self.build_lib)) / "smith_fast" / compat.SUMS
        sums: dict[str, str] = {}
        if out.exists():
            sums.update(line.split(maxsplit=1) for line in out.read_text().splitlines() if line.strip())
        for ext in self.extensions:
            if ext.name in compat.COMPILED_IN_PLACE:
                source = str(HERE / (ext.name.replace(".", "/") + ".py"))
                sums[ext.name] = f"{compat.source_sum(source)} {compat.source_stamp(source)}"
        if sums:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("".join(f"{name} {noted}\n" for name, noted in sorted(sums.items())))

    def build_sandbox_helper(self) -> None:
        """``csrc/sandbox_exec.c`` → ``smith_fast/sandbox/sandbox-exec``: the one program that sandboxes
        every process the service starts for a peer. Built in every mode (it is not a twin of
        anything: ``SMITH_FAST_NO_EXTENSIONS`` leaves it alone), and a failure fails the build."""
        if sys.platform != "linux":
            return
        compiler = self.compiler
        if compiler is None or isinstance(compiler, str):  # no extension to build: make our own
            from setuptools._distutils.ccompiler import new_compiler
            from setuptools._distutils.sysconfig import customize_compiler

            compiler = new_compiler()
            customize_compiler(compiler)
        out_dir = HERE / "smith_fast" / "sandbox" if self.inplace else pathlib.Path(self.build_lib) / "smith_fast" / "sandbox"
        out_dir.mkdir(parents=True, exist_ok=True)
        objects = compiler.compile(["csrc/sandbox_exec.c"], output_dir=self.build_temp, include_dirs=["csrc"],
                                   extra_postargs=["-O2", "-Wall", "-Werror", "-fPIE"])
        # Static where the C library's archive is installed (libc6-dev has it; Fedora's is
        # glibc-static), else dynamic; bound at load either way (-z now). A session's zygote init
        # forks every command's process: without the loader's mappings, and with no lazy binding
        # left for each child to do (and write) again, that costs ~20% less CPU (about 70 us a
        # command on this 2-core VM), and a one-shot start skips the loader altogether.
        from setuptools._distutils.errors import LinkError

        for flags in (["-static-pie", "-Wl,-z,now"], ["-pie", "-Wl,-z,now"]):
            try:
                compiler.link_executable(objects, "sandbox-exec", output_dir=str(out_dir), extra_postargs=flags)
                break
            except LinkError:
                if flags[0] == "-pie":
                    raise

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            raise SystemExit(HINT.format(error=f"{ext.name}: {exc}")) from exc


def _compat():  # type: ignore[no-untyped-def]
    """``smith_fast/_compat.py`` (what is compiled in place, and how its sources are summed), read
    without importing the package (its ``__init__`` needs what is being built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_smith_fast_compat", HERE / "smith_fast" / "_compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    in_place = [
        Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=["-O3"] if sys.platform != "win32" else [])
        for name in sorted(_compat().COMPILED_IN_PLACE)
        if not only or name.rpartition(".")[2] in only
    ]
    kernels = cythonize(
        exts,
        include_path=["csrc"],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
        },
    )
    # Plain Python compiled as it is: Python's semantics kept (negative indexes, checked bounds,
    # Python division), and annotations are for readers and type checkers only, so the compiled
    # module accepts exactly what the source does.
    return kernels + cythonize(
        in_place,
        compiler_directives={"language_level": "3", "annotation_typing": False, "binding": True},
        nthreads=os.cpu_count() or 1,
    ) if in_place else kernels


class WithHelper(Distribution):
    """Runs ``build_ext`` even with no extension to build (``SMITH_FAST_NO_EXTENSIONS``): it also
    builds the sandbox program."""

    def has_ext_modules(self) -> bool:
        return True


setup(ext_modules=extensions(), cmdclass={"build_ext": LoudBuildExt}, distclass=WithHelper)
