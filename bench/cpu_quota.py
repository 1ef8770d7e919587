"""Confine a process, and everything it starts, to a fraction of one CPU: the NATS scale-out
benchmark's workers (``bench/bench_nats.py``), each in a CPU cgroup of its own.

The first of these that this machine allows is used (:func:`find`):

* ``cpu.max`` (cgroup v2): a cell below our own cgroup, which needs ``cpu`` in our cgroup's
  ``cgroup.subtree_control`` (already there, or enabled now: only possible for the root cgroup or
  one without processes, the "no internal processes" rule; a delegated systemd unit's own cgroup
  holds our process, so there it usually fails);
* ``cpu.cfs_quota_us`` (cgroup v1): a cell below our cgroup in the ``cpu`` hierarchy, where a
  hybrid machine has that controller (needs write access there: root, or a delegated directory);
* ``systemd-run --user --scope -p CPUQuota=``: a transient scope per process, when a user manager
  answers.

Else :data:`NONE`: the processes run unconfined, and the benchmark says so in its output.

A process is put in its cell at birth: its command line is prefixed with a ``sh`` that writes its
own pid into the cell's ``cgroup.procs`` and ``exec``\\ s the real command (same pid), so nothing it
starts runs outside, not even during its start-up.

Why a worker's commands are bounded too (``smith_fast/containment.py``): each command runs in a cell
of the service's own, created under the service's cgroup, ``<own>/smith-fast-PID/cN``. In cgroup v2
that is a descendant of the worker's cell, so the cell's ``cpu.max`` covers it; in a v1 layout
containment makes cells only in the ``memory`` and ``pids`` hierarchies, never in ``cpu``, so a
command keeps the ``cpu`` cgroup it inherited from the worker at fork. Either way the benchmark
checks it while commands run (:meth:`Quota.inside` on the worker's descendants).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
from dataclasses import dataclass, field

from smith_fast.containment import cgroup_dir, cgroup_mounts, cgroup_paths

__all__ = ["NONE", "Quota", "find"]

PERIOD_US = 100_000


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


@dataclass
class Quota:
    """How processes are confined here, and their cells.

    Attributes:
        method: ``cgroup2 cpu.max``, ``cgroup1 cpu.cfs_quota_us``, ``systemd-run CPUQuota`` or ``none``.
        detail: what was found on this machine, in words (for the benchmark's output).
        fraction: the share of one CPU each cell gets.
        key: the hierarchy whose path :meth:`inside` compares (``""`` v2, ``cpu`` v1).
        base: the directory cells are made in (the cgroup methods).
        cells: each cell's directory (the cgroup methods) or cgroup path (systemd, once known).
        acct: v1 only, where ``cpuacct`` is a hierarchy of its own: the directory accounting cells
            are made in (each process joins one there too, so its cell's CPU can be read).
    """

    method: str
    detail: str
    fraction: float = 0.25
    key: str = ""
    base: str = ""
    mount: tuple[str, str] = ("", "")  # (mount point, root) of the hierarchy
    cells: dict[int, str] = field(default_factory=dict)
    acct: str = ""
    acct_cells: dict[int, str] = field(default_factory=dict)

    @property
    def confines(self) -> bool:
        return self.method != "none"

    def prefix(self, index: int) -> list[str]:
        """The command-line prefix that starts a process in cell ``index`` (made now); [] without one."""
        if self.method == "none":
            return []
        if self.method.startswith("systemd"):
            return ["systemd-run", "--user", "--scope", "--quiet", "-p", f"CPUQuota={self.fraction * 100:g}%", "--"]
        cell = f"{self.base}/smith-bench-{os.getpid()}-{index}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(cell)
        quota = round(self.fraction * PERIOD_US)
        if self.method.startswith("cgroup2"):
            _write(f"{cell}/cpu.max", f"{quota} {PERIOD_US}")
        else:
            _write(f"{cell}/cpu.cfs_period_us", str(PERIOD_US))
            _write(f"{cell}/cpu.cfs_quota_us", str(quota))
        self.cells[index] = cell
        if self.acct:
            counted = f"{self.acct}/smith-bench-{os.getpid()}-{index}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(counted)
            self.acct_cells[index] = counted
            return ["/bin/sh", "-c", 'echo $$ > "$0" && echo $$ > "$1" && shift && exec "$@"', f"{cell}/cgroup.procs",
                    f"{counted}/cgroup.procs"]
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{cell}/cgroup.procs"]

    def _path_of(self, pid: int) -> str | None:
        try:
            return cgroup_paths(pid).get(self.key)
        except (OSError, ValueError):
            return None

    def adopt(self, index: int, pid: int) -> None:
        """Learn the cell of a process started with :meth:`prefix` (systemd: its scope's path)."""
        if self.method.startswith("systemd"):
            path = self._path_of(pid)
            if path:
                self.cells[index] = path

    def inside(self, index: int, pid: int) -> bool | None:
        """Whether ``pid`` runs in cell ``index`` or below it; None when it is gone or unknown."""
        if self.method == "none" or index not in self.cells:
            return None
        path = self._path_of(pid)
        if path is None:
            return None
        cell = self.cells[index]
        if not self.method.startswith("systemd"):
            point, root = self.mount
            cell = root.rstrip("/") + "/" + os.path.relpath(cell, point).strip("/")
        return path == cell or path.startswith(cell.rstrip("/") + "/")

    def throttled(self, index: int) -> int | None:
        """Periods in which cell ``index`` was throttled so far (``cpu.stat`` ``nr_throttled``)."""
        if index not in self.cells or self.method.startswith("systemd") or self.method == "none":
            return None
        try:
            for line in pathlib.Path(f"{self.cells[index]}/cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "nr_throttled":
                    return int(value)
        except (OSError, ValueError):
            pass
        return None

    def usage(self, index: int) -> float | None:
        """CPU seconds cell ``index`` used so far, its process and all it started (v2 ``cpu.stat``
        ``usage_usec``, v1 ``cpuacct.usage``); None where this machine cannot say."""
        if self.method.startswith("cgroup2") and index in self.cells:
            try:
                for line in pathlib.Path(f"{self.cells[index]}/cpu.stat").read_text().splitlines():
                    name, _, value = line.partition(" ")
                    if name == "usage_usec":
                        return int(value) / 1e6
            except (OSError, ValueError):
                return None
        where = self.acct_cells.get(index) or (self.cells.get(index) if self.method.startswith("cgroup1") else None)
        if where:
            with contextlib.suppress(OSError, ValueError):
                return int(pathlib.Path(f"{where}/cpuacct.usage").read_text()) / 1e9
        return None

    def cleanup(self) -> None:
        """Remove the cells (their processes gone); what is still busy stays."""
        if self.method.startswith("cgroup"):
            for cell in [*self.cells.values(), *self.acct_cells.values()]:
                with contextlib.suppress(OSError):
                    os.rmdir(cell)
        self.cells.clear()
        self.acct_cells.clear()


NONE = Quota("none", "no CPU confinement possible here")


def _cgroup2(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str], notes: list[str]) -> Quota | None:
    v2 = next((m for m in mounts if m[2] == "cgroup2"), None)
    if v2 is None or "" not in own:
        notes.append("no cgroup v2 hierarchy")
        return None
    home = cgroup_dir(v2[0], v2[1], own[""])
    try:
        offered = pathlib.Path(home, "cgroup.controllers").read_text().split()
        enabled = pathlib.Path(home, "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        notes.append(f"cgroup v2 {home}: unreadable ({exc.strerror})")
        return None
    if "cpu" not in offered:
        notes.append(f"cgroup v2 {home}: no cpu controller offered (cgroup.controllers: {' '.join(offered) or 'none'})")
        return None
    if "cpu" not in enabled:
        try:
            _write(f"{home}/cgroup.subtree_control", "+cpu")
        except OSError as exc:
            notes.append(f"cgroup v2 {home}: cannot enable +cpu in cgroup.subtree_control ({exc.strerror}: "
                         "our own cgroup holds processes, or it is not delegated to us)")
            return None
    probe = f"{home}/smith-bench-probe-{os.getpid()}"
    try:
        os.mkdir(probe)
        _write(f"{probe}/cpu.max", f"25000 {PERIOD_US}")
    except OSError as exc:
        notes.append(f"cgroup v2 {home}: cannot make a child with cpu.max ({exc.strerror})")
        return None
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    return Quota("cgroup2 cpu.max", f"cgroup v2, cells under {home} (cpu enabled in its subtree_control)", key="",
                 base=home, mount=(v2[0], v2[1]))


def _cgroup1(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str], notes: list[str]) -> Quota | None:
    v1 = next((m for m in mounts if m[2] == "cgroup" and "cpu" in m[3]), None)
    if v1 is None or "cpu" not in own:
        notes.append("no cgroup v1 cpu hierarchy")
        return None
    home = cgroup_dir(v1[0], v1[1], own["cpu"])
    probe = f"{home}/smith-bench-probe-{os.getpid()}"
    try:
        os.mkdir(probe)
        _write(f"{probe}/cpu.cfs_quota_us", "25000")
    except OSError as exc:
        notes.append(f"cgroup v1 cpu {home}: cannot make a child with cpu.cfs_quota_us ({exc.strerror})")
        return None
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    quota = Quota("cgroup1 cpu.cfs_quota_us", f"cgroup v1 cpu hierarchy (a hybrid layout), cells under {home}",
                  key="cpu", base=home, mount=(v1[0], v1[1]))
    acct = next((m for m in mounts if m[2] == "cgroup" and "cpuacct" in m[3]), None)
    if acct is not None and "cpu" not in acct[3] and "cpuacct" in own:  # cpuacct mounted apart: a cell there too
        where = cgroup_dir(acct[0], acct[1], own["cpuacct"])
        if os.access(where, os.W_OK):
            quota.acct = where
            quota.detail += f", CPU accounted in cells under {where}"
    return quota


def _systemd(notes: list[str]) -> Quota | None:
    if shutil.which("systemd-run") is None:
        notes.append("no systemd-run")
        return None
    try:
        done = subprocess.run(["systemd-run", "--user", "--scope", "--quiet", "-p", "CPUQuota=25%", "--", "true"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"systemd-run --user --scope failed ({exc})")
        return None
    if done.returncode != 0:
        notes.append(f"systemd-run --user --scope failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return Quota("systemd-run CPUQuota", "a transient systemd --user scope per process (CPUQuota)", key="")


def find(fraction: float = 0.25) -> Quota:
    """The first way of confining processes to ``fraction`` of a CPU that works here (:data:`NONE`
    when none does: its ``detail`` then says what each attempt ran into)."""
    notes: list[str] = []
    try:
        mounts, own = cgroup_mounts(), cgroup_paths()
    except (OSError, ValueError) as exc:
        mounts, own = [], {}
        notes.append(f"cannot read this process's cgroups ({exc})")
    for attempt in (lambda: _cgroup2(mounts, own, notes), lambda: _cgroup1(mounts, own, notes), lambda: _systemd(notes)):
        quota = attempt()
        if quota is not None:
            quota.fraction = fraction
            if notes:
                quota.detail += " (tried first: " + "; ".join(notes) + ")"
            return quota
    return Quota("none", "no CPU confinement possible here: " + "; ".join(notes), fraction)
