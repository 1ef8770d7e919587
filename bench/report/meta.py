"""What a report ran on: machine, load, versions."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import subprocess
from importlib import metadata

__all__ = ["collect", "cpu_idle", "load_average"]

_PACKAGES = ("smith-fast", "protobuf", "grpcio", "uvloop", "orjson", "Cython", "matplotlib")


def load_average() -> str:
    """``os.getloadavg()`` as ``"1.50 1.75 2.47"`` (1, 5, 15 minutes)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cpu_idle() -> str:
    """How an idle CPU waits: the cpuidle driver, and for the ``haltpoll`` one (a KVM guest) how long
    it polls before it halts. With no polling, every wakeup of an idle CPU goes through the
    hypervisor, and a call made one at a time pays that twice (its server's wakeup and its
    client's): the round-trip figures move by about 2x with this setting alone."""
    base = pathlib.Path("/sys/devices/system/cpu/cpuidle")
    try:
        driver = (base / "current_driver").read_text().strip()
    except OSError:
        return "?"
    if driver != "haltpoll":
        return driver
    try:
        poll_ns = int(pathlib.Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text())
    except (OSError, ValueError):
        return driver
    return f"haltpoll, guest_halt_poll_ns {poll_ns}" + (" (no polling: every wakeup halts)" if poll_ns == 0 else "")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    """The commit of the source tree smith_fast was imported from, when it is a git checkout."""
    here = pathlib.Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{head}{' (with uncommitted changes)' if dirty else ''}"


def collect() -> dict[str, str]:
    """Machine and software facts for the report's header (load is sampled by the runner)."""
    from google.protobuf.internal import api_implementation

    from smith_fast import framing

    out = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
        "cpu idle": cpu_idle(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "client wire core": framing.IMPLEMENTATION,
        "protobuf backend": api_implementation.Type(),
    }
    for name in _PACKAGES:
        out[name] = _version(name)
    commit = _git_commit()
    if commit:
        out["git commit"] = commit
    return out
