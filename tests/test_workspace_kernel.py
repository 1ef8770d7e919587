"""The kernel side of ``serve --workspaces`` on the real kernel: the namespace, the mount host, the
sandbox program's ``--cover``.

:func:`~smith_fast.workspaces.namespace.enter` changes its process for good (a user and mount
namespace, every capability dropped), so each test runs it in a Python process of its own, the
*service* here, and reads what it saw as one JSON line. The tests run as root (where every refusal
below would otherwise succeed) and again as an unprivileged user (uid 65534, on directories it
owns), which is how the service is meant to run. Their directories are under /var/tmp, not /tmp: a
command's /tmp is a private tmpfs, which would hide the workspaces directory by accident and make
the cover tests mean nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from smith_fast.sandbox import HELPER, Sandbox

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
NOBODY = 65534
USERS = ["root", "nobody"]

# What every service script starts with: enter the namespace (templates may be lower layers in
# place), then helpers. argv: top, template.
PRELUDE = """
import errno, json, os, pathlib, shutil, stat, subprocess, sys, threading, time
from smith_fast.errors import MountError
from smith_fast.workspaces import namespace
TOP, TEMPLATE = sys.argv[1], sys.argv[2]
host = namespace.enter(pathlib.Path(TOP), [pathlib.Path(TEMPLATE)])
out = {}

def refused(op, **args):
    try:
        host.call(op, **args)
    except MountError as exc:
        return [exc.errno, exc.strerror]
    return None

def workspace(name, size=1 << 20):
    # What the store does: a tmpfs for the session, an upper and work dir in it, the overlay.
    base = f"{TOP}/s/{name}"
    os.makedirs(base, exist_ok=True)
    host.call("tmpfs", path=base, size_bytes=size, inodes=1000)
    for d in ("upper", "work", "root", "layers"):
        os.mkdir(f"{base}/{d}")
    host.call("overlay", target=f"{base}/root", lowers=[TEMPLATE], upper=f"{base}/upper", work=f"{base}/work")
    return base

def cap_eff():
    return next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:"))
"""


@pytest.fixture
def places(request: pytest.FixtureRequest) -> Iterator[dict[str, pathlib.Path]]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-wsk-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        template = base / "template"
        (template / "sub").mkdir(parents=True)
        (template / "keep.txt").write_text("kept\n")
        (template / "edit.txt").write_text("before\n")
        (template / "gone.txt").write_text("to be deleted\n")
        (template / "sub" / "deep.txt").write_text("deep\n")
        outside = base / "outside"
        outside.mkdir()
        (outside / "host.txt").write_text("the host's\n")
        home = base / "home"
        home.mkdir()
        for path in (outside, home, outside / "host.txt"):
            os.chown(path, NOBODY, NOBODY)
        yield {"base": base, "template": template, "outside": outside, "top": home / "ws"}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def own_template(places: dict[str, pathlib.Path], user: str) -> None:
    """The template belongs to the service's user, as an operator's would (files keep their owners)."""
    if user == "nobody":
        for path in [places["template"], *places["template"].rglob("*")]:
            os.chown(path, NOBODY, NOBODY)


def service(code: str, places: dict[str, pathlib.Path], user: str = "root", *, stdin: int | None = subprocess.DEVNULL,
            prelude: bool = True) -> subprocess.Popen[str]:
    """Start a service script (PRELUDE + code) as ``user``."""
    prefix = [] if user == "root" else ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    script = (PRELUDE if prelude else "") + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([*prefix, PY, "-c", script, str(places["top"]), str(places["template"])], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")


def run(code: str, places: dict[str, pathlib.Path], user: str = "root", *, prelude: bool = True) -> dict[str, Any]:
    proc = service(code, places, user, prelude=prelude)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("user", USERS)
def test_an_overlay_is_written_frozen_into_a_layer_and_read_back(places: dict[str, pathlib.Path], user: str) -> None:
    own_template(places, user)
    result = run("""
        out["cap_eff"] = cap_eff()
        out["cap_bnd"] = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapBnd:"))
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        out["service_mount"] = libc.mount(b"tmpfs", TOP.encode(), b"tmpfs", 0, None), ctypes.get_errno()
        base = workspace("a")
        root = f"{base}/root"
        pathlib.Path(root, "new.txt").write_text("new\\n")
        pathlib.Path(root, "edit.txt").write_text("after\\n")
        os.unlink(f"{root}/gone.txt")
        st = os.lstat(f"{base}/upper/gone.txt")
        out["whiteout"] = [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]
        # Freeze: the upper becomes a layer (a rename within the tmpfs), a fresh upper and work dir.
        os.rename(f"{base}/upper", f"{base}/layers/1")
        os.mkdir(f"{base}/upper")
        os.rename(f"{base}/work", f"{base}/work.old")
        os.mkdir(f"{base}/work")
        host.call("replace", target=root, lowers=[f"{base}/layers/1", TEMPLATE], upper=f"{base}/upper", work=f"{base}/work")
        pathlib.Path(root, "sub", "later.txt").write_text("later\\n")
        out["after"] = {p: open(f"{root}/{p}").read() for p in ("new.txt", "edit.txt", "keep.txt", "sub/deep.txt", "sub/later.txt")}
        out["listing"] = sorted(os.listdir(root))
        out["new_upper"] = sorted(str(p.relative_to(f"{base}/upper")) for p in pathlib.Path(f"{base}/upper").rglob("*"))
        # A read-only view of the frozen chain: what a checkpoint's Diff or a fork reads.
        os.mkdir(f"{base}/view")
        host.call("overlay", target=f"{base}/view", lowers=[f"{base}/layers/1", TEMPLATE], upper=None, work=None)
        out["view"] = sorted(os.listdir(f"{base}/view"))
        try:
            open(f"{base}/view/x", "w")
            out["view_write"] = "written"
        except OSError as exc:
            out["view_write"] = exc.errno
        # A view of one layer (overlayfs wants two without an upper): that layer, read-only.
        os.mkdir(f"{base}/view1")
        host.call("overlay", target=f"{base}/view1", lowers=[f"{base}/layers/1"], upper=None, work=None)
        out["view1"] = sorted(os.listdir(f"{base}/view1"))
        try:
            open(f"{base}/view1/x", "w")
            out["view1_write"] = "written"
        except OSError as exc:
            out["view1_write"] = exc.errno
        host.call("umount", path=f"{base}/view1")
        # The tmpfs's size is the workspace's bound: writing past it is ENOSPC.
        try:
            with open(f"{root}/big", "wb") as f:
                f.write(b"x" * (2 << 20))
            out["enospc"] = "written"
        except OSError as exc:
            out["enospc"] = exc.errno
        os.unlink(f"{root}/big")
        # The old work dir holds a mode 000 dir that only the host (capable) can remove.
        try:
            shutil.rmtree(f"{base}/work.old")
            out["service_rmtree"] = "removed"
        except PermissionError:
            out["service_rmtree"] = "EACCES"
        host.call("rmtree", path=f"{base}/work.old")
        out["host_rmtree"] = os.path.exists(f"{base}/work.old")
        out["rmtree_over_mount"] = refused("rmtree", path=base)
        host.call("umount", path=f"{base}/view")
        host.call("umount", path=root)
        out["unmounted"] = os.listdir(root)
        print(json.dumps(out))
    """, places, user)
    assert result["cap_eff"] == "0000000000000000" and result["cap_bnd"] == "0000000000000000"
    assert result["service_mount"] == [-1, 1]  # EPERM: the service cannot mount, only the host
    assert result["whiteout"] == [True, 0, 0]
    assert result["after"] == {"new.txt": "new\n", "edit.txt": "after\n", "keep.txt": "kept\n", "sub/deep.txt": "deep\n",
                               "sub/later.txt": "later\n"}
    assert result["listing"] == ["edit.txt", "keep.txt", "new.txt", "sub"]
    assert result["new_upper"] == ["sub", "sub/later.txt"]
    assert result["view"] == ["edit.txt", "keep.txt", "new.txt", "sub"]
    assert result["view_write"] == 30  # EROFS
    assert result["view1"] == ["edit.txt", "gone.txt", "new.txt"] and result["view1_write"] == 30  # gone.txt: its whiteout
    assert result["enospc"] == 28
    assert result["service_rmtree"] == "EACCES" and result["host_rmtree"] is False
    assert result["rmtree_over_mount"][0] == 16  # EBUSY: never across a mount point
    assert result["unmounted"] == []
    # The template is used in place and never written.
    template = places["template"]
    assert sorted(os.listdir(template)) == ["edit.txt", "gone.txt", "keep.txt", "sub"]
    assert (template / "edit.txt").read_text() == "before\n"
    # Nothing of the namespace's mounts is seen on the host.
    assert not os.path.ismount(places["top"] / "s" / "a")


def test_paths_outside_top_are_refused(places: dict[str, pathlib.Path]) -> None:
    outside = places["outside"]
    result = run(f"""
        OUT = {str(outside)!r}
        os.makedirs(f"{{TOP}}/s", exist_ok=True)
        os.symlink(OUT, f"{{TOP}}/s/link")
        os.mkdir(f"{{TOP}}/s/d")
        out["outside"] = refused("tmpfs", path=OUT, size_bytes=4096, inodes=10)
        out["top_itself"] = refused("tmpfs", path=TOP, size_bytes=4096, inodes=10)
        out["dotdot"] = refused("tmpfs", path=f"{{TOP}}/s/../../outside", size_bytes=4096, inodes=10)
        out["relative"] = refused("umount", path="s/d")
        out["through_link"] = refused("tmpfs", path=f"{{TOP}}/s/link/x", size_bytes=4096, inodes=10)
        out["link_itself"] = refused("tmpfs", path=f"{{TOP}}/s/link", size_bytes=4096, inodes=10)
        out["lower_outside"] = refused("overlay", target=f"{{TOP}}/s/d", lowers=[OUT], upper=None, work=None)
        out["upper_in_template"] = refused("overlay", target=f"{{TOP}}/s/d", lowers=[TEMPLATE], upper=TEMPLATE + "/sub",
                                           work=f"{{TOP}}/s/d")
        out["rmtree_outside"] = refused("rmtree", path=OUT)
        out["rmtree_top"] = refused("rmtree", path=TOP)
        out["missing_lower"] = refused("overlay", target=f"{{TOP}}/s/d", lowers=[f"{{TOP}}/s/nope"], upper=None, work=None)
        out["unknown"] = refused("chmod", path=f"{{TOP}}/s/d")
        out["mounted"] = [os.path.ismount(OUT), os.path.ismount(f"{{TOP}}/s/d")]
        print(json.dumps(out))
    """, places)
    for key in ("outside", "top_itself", "lower_outside", "upper_in_template", "rmtree_outside", "rmtree_top"):
        assert result[key][0] == 1 and "lies outside" in result[key][1], (key, result[key])
    for key in ("through_link", "link_itself"):
        assert result[key][0] == 1 and "symbolic link" in result[key][1], (key, result[key])
    assert result["dotdot"][0] == 22 and result["relative"][0] == 22
    assert result["missing_lower"][0] == 22 and "/s/nope" in result["missing_lower"][1] and "No such file" in result["missing_lower"][1]
    assert result["unknown"][0] == 22
    assert result["mounted"] == [False, False]
    assert os.listdir(outside) == ["host.txt"]


def _mount_namespaces() -> set[str]:
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.add(os.readlink(f"/proc/{pid}/ns/mnt"))
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("user", USERS)
def test_the_mount_host_and_the_mounts_end_with_the_service(places: dict[str, pathlib.Path], user: str) -> None:
    proc = service("""
        base = workspace("a")
        out["host"] = host.pid
        out["idle"] = host.idle.pid
        out["ns"] = os.readlink("/proc/self/ns/mnt")
        out["host_fds"] = sorted(int(fd) for fd in os.listdir(f"/proc/{host.pid}/fd"))
        host.idle.call("ping")  # it serves: its start-up (closing what it inherited) is over
        out["idle_fds"] = sorted(int(fd) for fd in os.listdir(f"/proc/{host.idle.pid}/fd"))
        out["nice"] = [os.getpriority(os.PRIO_PROCESS, p) for p in (host.pid, host.idle.pid)]
        print(json.dumps(out), flush=True)
        sys.stdin.readline()
        host.call("ping")  # after the host was sent SIGTERM: it ignores it
        print(json.dumps({"pinged": True}), flush=True)
        sys.stdin.readline()
    """, places, user, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        first = json.loads(proc.stdout.readline())
        pid, idle, ns = int(first["host"]), int(first["idle"]), str(first["ns"])
        assert len(first["host_fds"]) == 4  # /dev/null thrice and its socket: nothing else of the service's
        assert len(first["idle_fds"]) == 4  # the same for the background host (not the first host's socket)
        assert first["nice"] == [os.getpriority(os.PRIO_PROCESS, 0), 19]  # the background host yields the cores
        assert idle != pid and _alive(idle) and os.readlink(f"/proc/{idle}/ns/mnt") == ns
        assert _alive(pid) and ns in _mount_namespaces() and ns != os.readlink("/proc/self/ns/mnt")
        os.kill(pid, signal.SIGTERM)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"pinged": True}
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid)
        while _alive(idle) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(idle)
        # No process is left in the namespace: it is gone, and its mounts and tmpfs memory with it.
        while ns in _mount_namespaces() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ns not in _mount_namespaces()
    finally:
        proc.kill()
        proc.wait()


def test_replace_never_shows_what_is_under_the_mount(places: dict[str, pathlib.Path]) -> None:
    result = run("""
        base = workspace("a")
        root = f"{base}/root"
        pings = []
        for _ in range(200):
            t = time.perf_counter()
            host.call("ping")
            pings.append(time.perf_counter() - t)
        # What lies under the overlay in the tmpfs: a fs tool landing on an unmounted root would see it.
        host.call("umount", path=root)
        pathlib.Path(root, "UNDER").write_text("")
        host.call("overlay", target=root, lowers=[TEMPLATE], upper=f"{base}/upper", work=f"{base}/work")
        seen, stop = [], False
        def look():
            while not stop:
                names = sorted(os.listdir(root))
                if names != ["edit.txt", "gone.txt", "keep.txt", "sub"]:
                    seen.append(names)
        reader = threading.Thread(target=look)
        reader.start()
        replaces = []
        for i in range(200):
            os.mkdir(f"{base}/u{i}")
            os.mkdir(f"{base}/w{i}")
            t = time.perf_counter()
            host.call("replace", target=root, lowers=[TEMPLATE], upper=f"{base}/u{i}", work=f"{base}/w{i}")
            replaces.append(time.perf_counter() - t)
        stop = True
        reader.join()
        out["seen"] = seen[:5]
        out["ping_p50_us"] = sorted(pings)[len(pings) // 2] * 1e6
        out["replace_p50_us"] = sorted(replaces)[len(replaces) // 2] * 1e6
        out["mounts_at_root"] = sum(1 for l in open("/proc/self/mountinfo") if l.split()[4] == root)
        print(json.dumps(out))
    """, places)
    print(f"mount host round trip p50: ping {result['ping_p50_us']:.0f} us, replace {result['replace_p50_us']:.0f} us")
    assert result["seen"] == []
    assert result["mounts_at_root"] == 1  # each replaced overlay is gone, not stacked
    assert float(result["replace_p50_us"]) < 50_000


def test_a_threaded_process_cannot_enter(places: dict[str, pathlib.Path]) -> None:
    result = run("""
        import pathlib, sys, threading, json
        from smith_fast.errors import StartupError
        from smith_fast.workspaces import namespace
        done = threading.Event()
        threading.Thread(target=done.wait).start()
        try:
            namespace.enter(pathlib.Path(sys.argv[1]))
            out = {"entered": True}
        except StartupError as exc:
            out = {"error": str(exc)}
        done.set()
        print(json.dumps(out))
    """, places, prelude=False)
    assert "single-threaded" in str(result["error"])


def test_without_user_namespaces_the_start_fails_and_says_why(places: dict[str, pathlib.Path]) -> None:
    # The limit of a user namespace of our own set to 0: what the sysctl does to the whole machine.
    code = textwrap.dedent("""
        import pathlib, sys
        from smith_fast.errors import WorkspacesUnavailable
        from smith_fast.workspaces import namespace
        try:
            namespace.enter(pathlib.Path(sys.argv[1]))
        except WorkspacesUnavailable as exc:
            print(exc)
    """)
    shell = f'echo 0 > /proc/sys/user/max_user_namespaces && exec {PY} -c "$0" "$1"'
    done = subprocess.run(["unshare", "-Ur", "sh", "-c", shell, code, str(places["base"] / "ws")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "user namespaces" in done.stdout and "user.max_user_namespaces is 0" in done.stdout


COMMAND = r"""
top=$1; other=$2; template=$3; outside=$4
echo "pwd=$(pwd)"
echo "s=$(ls "$top/s" | tr '\n' ' ')"
echo "top=$(ls -A "$top" | tr '\n' ' ')"
cat "$other/root/secret.txt" 2>/dev/null && echo "other=read" || echo "other=hidden"
ls "$template" >/dev/null 2>&1 && echo "template=listed" || echo "template=hidden"
echo made > made.txt && echo "write=$(cat made.txt)"
echo "seen=$(cat keep.txt)"
touch "$top/x" 2>/dev/null && echo "cover_write=yes" || echo "cover_write=no"
mkdir "$top/s/b2" 2>/dev/null && echo "cover_mkdir=yes" || echo "cover_mkdir=no"
umount "$top" 2>/dev/null && echo "umount=yes" || echo "umount=no"
unshare -Urm sh -c "umount '$top'" 2>/dev/null && echo "userns_umount=yes" || echo "userns_umount=no"
unshare -Um --propagation unchanged sh -c "umount -l '$top'" 2>/dev/null && echo "userns_umount2=yes" || echo "userns_umount2=no"
ln "$outside/host.txt" link.txt 2>/dev/null && echo "hardlink=yes" || echo "hardlink=no"
echo "cap=$(grep CapEff /proc/self/status | cut -f2)"
"""


@pytest.mark.parametrize("user", USERS)
def test_a_command_sees_its_own_workspace_and_nothing_else_of_the_directory(places: dict[str, pathlib.Path], user: str) -> None:
    own_template(places, user)
    result = run(f"""
        from smith_fast.sandbox import Sandbox
        a, b = workspace("a"), workspace("b")
        pathlib.Path(b, "root", "secret.txt").write_text("b's\\n")
        base = Sandbox(mode="workspace-write", network="off")
        sandbox = base.for_workspace(f"{{a}}/root", TOP, [TEMPLATE])
        sandbox.check()  # the start-up probe, with the cover, in the namespace
        argv = sandbox.wrap(["/bin/sh", "-c", {COMMAND!r}, "sh", TOP, b, TEMPLATE, {str(places["outside"])!r}], sandbox.writable())
        done = subprocess.run(argv, cwd=f"{{a}}/root", env=sandbox.wrap_environ(os.environ), capture_output=True, text=True,
                              timeout=60)
        out["rc"], out["stderr"] = done.returncode, done.stderr
        out["lines"] = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        out["upper"] = sorted(os.listdir(f"{{a}}/upper"))
        reading = Sandbox(mode="read-only", network="off").for_workspace(f"{{b}}/root", TOP, [TEMPLATE])
        script = "cat secret.txt; ls $0/s; echo x > y.txt || echo refused"
        done = subprocess.run(reading.wrap(["/bin/sh", "-c", script, TOP], reading.writable()), cwd=f"{{b}}/root",
                              env=reading.wrap_environ(os.environ), capture_output=True, text=True, timeout=60)
        out["read_only"] = [done.returncode, done.stdout, "Read-only file system" in done.stderr]
        only = base.only_read(["/bin/grep", "CapEff", "/proc/self/status"], ["/proc"])
        out["only_read"] = subprocess.run(only, capture_output=True, text=True, timeout=60).stdout.split()
        print(json.dumps(out))
    """, places, user)
    lines = result["lines"]
    assert result["rc"] == 0, result["stderr"]
    assert isinstance(lines, dict)
    top = str(places["top"])
    assert lines["pwd"] == f"{top}/s/a/root"
    assert lines["s"] == "a " and lines["top"] == "s "  # b, layers, the probe's dir: not in view
    assert lines["other"] == "hidden" and lines["template"] == "hidden"
    assert lines["write"] == "made" and lines["seen"] == "kept"  # the root is writable, the template shows through
    assert lines["cover_write"] == "no" and lines["cover_mkdir"] == "no"
    assert lines["umount"] == "no" and lines["userns_umount"] == "no" and lines["userns_umount2"] == "no"
    assert lines["hardlink"] == "no"
    assert lines["cap"] == "0000000000000000"
    assert result["upper"] == ["made.txt"]  # what the command wrote is in the session's upper, nowhere else
    assert result["read_only"] == [0, "b's\nb\nrefused\n", True]
    assert result["only_read"] == ["CapEff:", "0000000000000000"]


@pytest.mark.parametrize("user", USERS)
def test_only_read_drops_the_capabilities_it_is_started_with(user: str) -> None:
    # uid 0 of a user namespace holds every capability there, as a child of the service may.
    prefix = [] if user == "root" else ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    grep = ["/bin/grep", "CapEff", "/proc/self/status"]
    held = subprocess.run([*prefix, "unshare", "-Ur", *grep], capture_output=True, text=True, timeout=30, cwd="/")
    dropped = subprocess.run([*prefix, "unshare", "-Ur", HELPER, "--only-read", "/proc", "--", *grep], capture_output=True, text=True,
                             timeout=30, cwd="/")
    assert held.stdout.split()[1] != "0000000000000000"
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.split() == ["CapEff:", "0000000000000000"]


def test_for_workspace_passes_the_cover_the_root_and_the_templates(tmp_path: pathlib.Path) -> None:
    sandbox = Sandbox(hidden=(str(tmp_path / "sock"),)).for_workspace(str(tmp_path / "ws/s/a/root"), str(tmp_path / "ws"),
                                                                   [str(tmp_path / "t")])
    argv = sandbox.wrap(["/bin/true"], sandbox.writable())
    assert sandbox.root == str(tmp_path / "ws/s/a/root") and sandbox.writable() == [sandbox.root]
    assert argv[argv.index("--cover") + 1] == str(tmp_path / "ws")
    assert argv[argv.index("--write") + 1] == sandbox.root
    hides = [argv[i + 1] for i, a in enumerate(argv) if a == "--hide"]
    assert hides == [str(tmp_path / "sock"), str(tmp_path / "t")]
    assert Sandbox(mode="read-only").for_workspace("/srv/ws/s/a/root", "/srv/ws", []).wrap(["/bin/true"], [])[-4:] == [
        "--cover", "/srv/ws", "--", "/bin/true"]
    with pytest.raises(ValueError):
        Sandbox(cover=("/",))
