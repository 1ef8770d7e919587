"""Everyday tools in the default sandbox (``--sandbox workspace-write``): each session has a home of
its own that its commands may write (HOME, the XDG directories, npm's, pip's, cargo's and go's
caches), so that ``npm install``, ``pip install``, ``git commit``, ``cargo build`` and ``go build``
work, offline, against local sources; a session sees no other session's home, nothing of the host's
real HOME becomes writable, a request still may not set the home variables, the home is bounded
and goes when its session ends. Against real services, real tools, the real kernel.

Everything lives under /var/tmp: a command's /tmp is a private tmpfs, out of which nothing of the
host's /tmp is in view.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator

import pytest

from smith_fast.client import Client
from smith_fast.errors import SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, wait_until


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, pathlib.Path]]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-home-", dir="/var/tmp"))
    out = {name: base / name for name in ("root", "homes", "realhome", "srv", "ws", "template", "pkgs")}
    for path in out.values():
        path.mkdir()
    (out["realhome"] / ".gitconfig").write_text("[user]\n\tname = the operator\n")
    yield out
    subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def _start(places: dict[str, pathlib.Path], *extra: str) -> ServerProcess:
    tmp = places["srv"] / uuid.uuid4().hex[:8]
    tmp.mkdir()
    # The service's own HOME is "realhome": what a command must not be able to write. Toolchains
    # installed in this user's real home (rustup's) are named as an operator's environment would.
    env = {"HOME": str(places["realhome"])}
    for name, sub in (("RUSTUP_HOME", ".rustup"), ("PYENV_ROOT", ".pyenv")):
        found = os.environ.get(name) or str(pathlib.Path.home() / sub)
        if os.path.isdir(found):
            env[name] = found
    return ServerProcess(tmp, "--home-dir", str(places["homes"]), "--kill-grace", "0.5s", *extra, root=places["root"],
                         env=env, tcp=False, log_level="info").start()


@pytest.fixture(scope="module")
def server(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    srv = _start(places, "--max-home-bytes", "4M")
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def _sh(client: Client, command: str, env: dict[str, str] | None = None) -> tuple[int, str, str, list[pb.LogEvent]]:
    out, err, code, logs = "", "", None, []
    async for ev in client.shell_exec(command, env=env):
        kind = ev.WhichOneof("event_type")
        if kind == "shell_output":
            o = ev.shell_output
            out += o.stdout if o.HasField("stdout") else ""
            err += o.stderr if o.HasField("stderr") else ""
            if o.finished:
                code = o.exit_code
        elif kind == "log":
            logs.append(ev.log)
    assert code is not None
    return code, out, err, logs


async def _ok(client: Client, command: str) -> str:
    code, out, err, _ = await _sh(client, command)
    assert code == 0, f"{command}: exit {code}\n{out}\n{err}"
    return out


async def _connect(srv: ServerProcess) -> Client:
    client = await Client.connect(srv.unix)
    await client.handshake()
    return client


def _homes(places: dict[str, pathlib.Path]) -> set[str]:
    """The homes of every service run under --home-dir (DIR/<run>/<home>)."""
    return {home.name for run in places["homes"].iterdir() for home in run.iterdir() if home.is_dir()}


# -- the tools -------------------------------------------------------------------------------------


async def test_npm_installs_a_packed_tarball_offline(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    pkg = places["pkgs"] / "npm-tiny"
    pkg.mkdir()
    (pkg / "package.json").write_text('{"name": "smith-tiny", "version": "1.0.0", "main": "index.js"}\n')
    (pkg / "index.js").write_text("module.exports = () => 'tiny says hi';\n")
    npm_home = places["pkgs"] / "npm-home"  # npm pack, here, must not use the service's HOME either
    done = subprocess.run(["npm", "pack", "--pack-destination", str(places["root"])], cwd=pkg, capture_output=True, text=True,
                          env={**os.environ, "HOME": str(npm_home)}, timeout=120)
    assert done.returncode == 0, done.stderr
    tarball = places["root"] / "smith-tiny-1.0.0.tgz"
    assert tarball.is_file()
    async with await _connect(server) as client:
        out = await _ok(client, f"mkdir -p npmapp && cd npmapp && echo '{{}}' > package.json && "
                                f"npm install --offline --no-audit --no-fund {tarball} >/dev/null && "
                                "node -e \"console.log(require('smith-tiny')())\" && ls \"$npm_config_cache\"")
        assert out.splitlines()[0] == "tiny says hi"
        assert out.splitlines()[1:], "npm wrote nothing in its cache: the home was not where it wrote"
    assert (places["root"] / "npmapp" / "node_modules" / "smith-tiny" / "index.js").is_file()


def _wheel(where: pathlib.Path) -> pathlib.Path:
    """A wheel of a one-module project, built here byte by byte (no build backend needed)."""
    name, version = "smith_tiny", "1.0"
    files = {
        f"{name}.py": b"def hello():\n    return 'tiny wheel says hi'\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return out


async def test_pip_installs_a_local_wheel_into_the_home(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    wheels = places["root"] / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    async with await _connect(server) as client:
        # --user: into the home itself (~/.local), which is what a read-only HOME refused. The
        # interpreter itself, not a version manager's shim (pyenv's would rehash its own read-only shims).
        py = "$(python3 -c 'import sys; print(sys.executable)')"
        await _ok(client, f"{py} -m pip install --user --no-index --find-links wheels smith_tiny --break-system-packages "
                          "--disable-pip-version-check -q")
        out = await _ok(client, f"{py} -c 'import smith_tiny; print(smith_tiny.hello(), smith_tiny.__file__)'")
        said, _, where = out.strip().rpartition(" ")
        home = (await _ok(client, 'echo "$HOME"')).strip()
        assert said == "tiny wheel says hi"
        assert where.startswith(f"{home}/.local/") and where.endswith("/smith_tiny.py"), where


async def test_git_commits_with_the_user_config_of_the_home(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await _connect(server) as client:
        await _ok(client, "git config --global user.name 'Smith Tester' && git config --global user.email tester@example.invalid")
        out = await _ok(client, "rm -rf gitrepo && git init -q gitrepo && cd gitrepo && echo a > f && git add f && "
                                "git commit -qm first && git log --format='%an <%ae>'")
        assert out == "Smith Tester <tester@example.invalid>\n"
    # The operator's own configuration is untouched (it was readable, never writable).
    assert (places["realhome"] / ".gitconfig").read_text() == "[user]\n\tname = the operator\n"


async def test_cargo_builds_a_crate_offline(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    crate = places["root"] / "tinycrate"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "tinycrate"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n')
    (crate / "src" / "main.rs").write_text('fn main() { println!("crate says hi"); }\n')
    async with await _connect(server) as client:
        out = await _ok(client, "cd tinycrate && cargo build --offline -q && ./target/debug/tinycrate && test -d \"$CARGO_HOME\" && echo home")
        assert out == "crate says hi\nhome\n"


async def test_go_builds_a_module(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    mod = places["root"] / "gomod"
    mod.mkdir()
    (mod / "go.mod").write_text("module example.invalid/tiny\n\ngo 1.19\n")
    (mod / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("go says hi") }\n')
    async with await _connect(server) as client:
        out = await _ok(client, 'cd gomod && GOFLAGS=-mod=mod go build -o tiny . && ./tiny && ls "$GOCACHE" | head -1 | wc -l')
        assert out == "go says hi\n1\n"


# -- privacy, policy, bounds, lifetime ------------------------------------------------------------------


async def test_a_session_sees_only_its_own_home_and_the_real_home_stays_read_only(server: ServerProcess,
                                                                                  places: dict[str, pathlib.Path]) -> None:
    async with await _connect(server) as a, await _connect(server) as b:
        home_a = (await _ok(a, 'echo secret-a > "$HOME/secret" && echo "$HOME"')).strip()
        home_b = (await _ok(b, 'echo "$HOME"')).strip()
        run = os.path.dirname(home_a)
        assert home_a != home_b and os.path.dirname(home_b) == run and os.path.dirname(run) == str(places["homes"])
        assert (pathlib.Path(home_a) / "secret").read_text() == "secret-a\n"
        # B's view of the homes directory holds its own home only: A's is not there to read or write.
        assert (await _ok(b, f'ls -A {places["homes"]}')).split() == [os.path.basename(run)]
        assert (await _ok(b, f"ls -A {run}")).split() == [os.path.basename(home_b)]
        code, _, err, _ = await _sh(b, f"cat {home_a}/secret")
        assert code != 0 and "No such file" in err
        code, _, err, _ = await _sh(b, f"echo x > {home_a}/planted")
        assert code != 0 and not (pathlib.Path(home_a) / "planted").exists()
        # The service's real HOME: readable as before, not writable.
        code, _, err, _ = await _sh(b, f"echo pwned >> {places['realhome']}/.gitconfig")
        assert code != 0 and ("Read-only file system" in err or "Permission denied" in err)
        assert await _ok(b, f"cat {places['realhome']}/.gitconfig") == "[user]\n\tname = the operator\n"


async def test_a_request_still_may_not_set_the_home_variables(server: ServerProcess) -> None:
    async with await _connect(server) as client:
        for name in ("HOME", "npm_config_cache", "XDG_CONFIG_HOME", "CARGO_HOME"):
            with pytest.raises(SmithError) as caught:
                await _sh(client, "true", env={name: "/var/tmp/elsewhere"})
            assert caught.value.code == pb.ERROR_CODE_PERMISSION_DENIED and caught.value.details["variables"] == name


async def test_a_home_over_its_bound_is_emptied_before_the_next_command(server: ServerProcess) -> None:
    """The home is measured in the background (at most every second, never while a command waits
    to start): a command that starts after a measurement found it over the bound finds it emptied."""
    async with await _connect(server) as client:
        await _ok(client, 'git config --global user.name keep && head -c 6000000 /dev/zero > "$HOME/big"')
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            code, out, _, logs = await _sh(client, 'ls -A "$HOME"')
            if logs or asyncio.get_running_loop().time() > deadline:
                break
            assert out == ".gitconfig\nbig\n"
            await asyncio.sleep(0.2)
        assert code == 0 and out == ""
        assert [log.fields["reason"] for log in logs] == ["home_emptied"] and int(logs[0].fields["bytes"]) > 4 << 20
        code, out, _, logs = await _sh(client, 'echo small > "$HOME/small" && ls -A "$HOME"')
        assert (code, out, logs) == (0, "small\n", [])


async def test_the_home_goes_when_the_session_ends(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    before = _homes(places)
    client = await _connect(server)
    home = (await _ok(client, 'mkdir -p "$HOME/ro/deep" && echo x > "$HOME/ro/deep/f" && chmod -R a-w "$HOME/ro" && echo "$HOME"')).strip()
    assert os.path.basename(home) in _homes(places) - before
    await client.close()
    # Read-only directories too (go's module cache is made of them).
    assert wait_until(lambda: not os.path.exists(home), 10), os.listdir(home)


async def test_the_home_outlives_a_dropped_connection_within_the_resume_window(places: dict[str, pathlib.Path]) -> None:
    srv = _start(places, "--resume-window", "3s")
    try:
        client = await Client.connect(srv.unix, resume=True)
        await client.handshake()
        home = (await _ok(client, 'echo kept > "$HOME/f" && echo "$HOME"')).strip()
        client._writer.transport.abort()  # the connection drops (the SDK's own transport); it resumes
        while not client.resumes:
            await asyncio.sleep(0.01)
        assert await _ok(client, 'cat "$HOME/f"') == "kept\n"  # parked, not ended: the same home
        await client.close()  # parked again: the peer may still come back within the window
        await asyncio.sleep(0.5)
        assert pathlib.Path(home, "f").read_text() == "kept\n"
        assert wait_until(lambda: not os.path.exists(home), 15)  # the window passed: the session ended, its home went
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_a_home_dir_that_overlaps_the_root_or_the_state_is_refused(places: dict[str, pathlib.Path]) -> None:
    for name, home_dir in (("in-root", places["root"] / "homes"), ("state", places["srv"] / "state" / "homes")):
        sock = places["srv"] / f"{name}.sock"
        done = subprocess.run(
            [sys.executable, "-m", "smith_fast", "serve", "--unix", str(sock), "--root", str(places["root"]),
             "--state-dir", str(places["srv"] / "state"), "--home-dir", str(home_dir)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(places["realhome"])},
        )
        assert done.returncode != 0 and f"--home-dir {home_dir}" in done.stderr and "overlaps" in done.stderr, done.stderr
        assert not home_dir.exists()


def test_a_home_dir_that_cannot_be_made_names_it_and_says_what_to_do(places: dict[str, pathlib.Path]) -> None:
    # a $XDG_CACHE_HOME that cannot hold it: the start said only "[Errno 2] No such file or directory: '/proc/nope'"
    done = subprocess.run(
        [sys.executable, "-m", "smith_fast", "serve", "--unix", str(places["srv"] / "nope.sock"), "--root", str(places["root"])],
        capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_CACHE_HOME": "/proc/nope"},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        "smith-fast serve: cannot start: --home-dir /proc/nope/smith-fast/homes: cannot make the sessions' homes there (No such "
        "file or directory): give a writable directory with --home-dir, or set $XDG_CACHE_HOME"), done.stderr


# -- with --workspaces -------------------------------------------------------------------------------


async def test_with_workspaces_the_home_is_in_the_sessions_volume(places: dict[str, pathlib.Path]) -> None:
    (places["template"] / "README").write_text("template\n")
    srv = _start(places, "--workspaces", str(places["ws"]), "--template", f"t={places['template']}", "--max-workspace-bytes", "8M")
    try:
        async with await Client.connect(srv.unix) as a, await Client.connect(srv.unix) as b:
            await a.handshake(["shell_exec", "workspaces"])
            await b.handshake(["shell_exec", "workspaces"])
            home = (await _ok(a, 'git config --global user.name ws-user && echo "$HOME"')).strip()
            assert home.startswith(f"{places['ws']}/s/") and home.endswith("/home")
            assert await _ok(a, "git config --global user.name") == "ws-user\n"
            # Another session: its own home, and a's not in view.
            assert await _ok(b, "git config --global user.name || echo none") == "none\n"
            code, _, _, _ = await _sh(b, f"ls {home}")
            assert code != 0
            # The volume's tmpfs bounds it: past --max-workspace-bytes, ENOSPC.
            code, _, err, _ = await _sh(a, 'head -c 12000000 /dev/zero > "$HOME/big"')
            assert code != 0 and "No space left on device" in err
            assert not os.path.exists(f"{home}/../root/big")  # the home is not in the workspace's overlay
        assert wait_until(lambda: not os.path.exists(home), 10)
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def test_a_background_process_keeps_its_home_until_it_ends(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    go = places["root"] / f"go-{uuid.uuid4().hex}"
    client = await _connect(server)
    home = (await _ok(client, 'echo "$HOME"')).strip()
    await client.background(f'echo started > "$HOME/bg"; while [ ! -e {go} ]; do sleep 0.02; done; cat "$HOME/bg" > {go}.out')
    await client.close()  # the session ends at once; its background process runs on, and writes its home
    await asyncio.sleep(0.5)
    assert pathlib.Path(home, "bg").read_text() == "started\n"
    go.touch()
    assert wait_until(lambda: pathlib.Path(f"{go}.out").exists() and not os.path.exists(home), 10)
    assert pathlib.Path(f"{go}.out").read_text() == "started\n"


def test_homes_a_dead_service_left_are_removed_at_start_and_a_live_ones_stay(places: dict[str, pathlib.Path]) -> None:
    top = places["homes"]
    dead, live = top / "deadrun", top / "liverun"
    for run in (dead, live):
        (run / "somehome" / "ro").mkdir(parents=True)
        (run / ".smith-fast-run.lock").touch()
    (dead / "somehome" / "ro").chmod(0o500)  # removed all the same
    held = os.open(live / ".smith-fast-run.lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a running service holds its run directory
        before = {p.name for p in top.iterdir()} - {"deadrun"}  # the live ones: this one, other tests' services
        srv = _start(places)
        try:
            assert not dead.exists() and (live / "somehome").is_dir()
            after = {p.name for p in top.iterdir()}
            assert before <= after
            mine = after - before
            assert len(mine) == 1
        finally:
            assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
        assert not (top / mine.pop()).exists()  # a clean stop takes its own run directory with it
        assert (live / "somehome").is_dir()
    finally:
        os.close(held)
        shutil.rmtree(live)
