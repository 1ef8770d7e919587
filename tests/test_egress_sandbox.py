"""``--network allow``: egress by name, through a real ``smith-fast serve`` and real local servers.

The service runs with an allow-list naming ``allowed.test`` (mapped to 127.0.0.1 by the proxy's
resolver override, for the test only) and the address rule ``127.0.0.1/32`` that loopback needs
even when its name is allowed. Commands use curl, pip, git, socat and Python's urllib unchanged:
the proxy variables the service sets are all they need. Everything else is an attack and must
fail: a name not allowed, a raw socket to the host's address, a direct IP, the cloud metadata
address, the host's loopback services, a unix socket file outside the workspace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import io
import json
import os
import pathlib
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from smith_fast.client import Client
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, ServerStartError, wait_until

PY = "/work/main/.venv/bin/python" if os.path.exists("/work/main/.venv/bin/python") else shutil.which("python3") or "python3"
SECRET = "real-" + uuid.uuid4().hex  # the service's value of $EGS_TEST_TOKEN: no command may see it
WHEEL = "tinypkg-1.0-py3-none-any.whl"


# -- the local servers --------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files of the served directory (the pip index, the bare git repository); /headers answers
    with the request's headers, and records them for the test."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        if self.path.startswith("/headers"):
            headers = dict(self.headers.items())
            _Handler.seen.append(headers)
            body = json.dumps(headers).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path in ("/echo-chunked", "/echo-length"):
            self._echo(self.path == "/echo-chunked")
            return
        super().do_GET()

    def _echo(self, chunked: bool) -> None:
        """The Authorization header echoed back in a header and twice in the body, written in
        pieces cut inside the value (in the head, a chunk's size line and the body), each its own
        segment: the proxy reads the value in parts."""
        _Handler.seen.append(dict(self.headers.items()))
        value = self.headers["Authorization"].encode()
        half = len(value) // 2
        text = b"got " + value + b" and " + value + b"\n"
        if chunked:
            body = (b"%x\r\n%b\r\n" % (8 + half, text[:8 + half]) + b"%x\r\n%b\r\n" % (len(text) - 8 - half, text[8 + half:])
                    + b"0\r\n\r\n")
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            body, framing = text, b"Content-Length: %d\r\n" % len(text)
        raw = b"HTTP/1.1 200 OK\r\nX-Echo: " + value + b"\r\n" + framing + b"\r\n" + body
        first = raw.index(value)
        cuts = [first + 3, first + half, raw.index(b"\r\n\r\n") + 5, len(raw) - len(value) + 1, len(raw) - 3]
        at = 0
        for cut in cuts + [len(raw)]:
            self.wfile.write(raw[at:cut])
            self.wfile.flush()
            time.sleep(0.03)
            at = cut

    def log_message(self, format: str, *args: Any) -> None:
        return


def _wheel() -> bytes:
    """A pure-Python wheel of one module, built here (no build backend, no network)."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinypkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buf.getvalue()


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, pathlib.Path]]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-egress-", dir="/var/tmp"))
    out = {name: base / name for name in ("root", "state", "home", "www", "host")}
    for path in out.values():
        path.mkdir()
    simple = out["www"] / "simple" / "tinypkg"
    simple.mkdir(parents=True)
    (simple / WHEEL).write_bytes(_wheel())
    (simple / "index.html").write_text(f'<html><body><a href="{WHEEL}">{WHEEL}</a></body></html>\n')
    (out["www"] / "hello").write_text("hello from allowed.test\n")
    work = base / "work"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "one"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(out["www"] / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(out["www"] / "repo.git"), "update-server-info"], check=True)
    try:
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def http_port(places: dict[str, pathlib.Path]) -> Iterator[int]:
    handler = lambda *a: _Handler(*a, directory=str(places["www"]))  # noqa: E731
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    """A TCP echo server on the host's loopback."""
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                data = conn.recv(1024)
                conn.sendall(b"echo:" + data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    sock.close()


@pytest.fixture(scope="module")
def host_socket(places: dict[str, pathlib.Path]) -> Iterator[str]:
    """A host service on a socket file under /var/tmp, outside the workspace (docker.sock's shape)."""
    path = str(places["host"] / "service.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    os.chmod(path, 0o777)
    sock.listen()
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nHOST-SERVICE")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join()
    sock.close()


@pytest.fixture(scope="module")
def https(places: dict[str, pathlib.Path]) -> Iterator[tuple[int, pathlib.Path]]:
    """An HTTPS server for allowed.test with a certificate from a test CA (trustme), and the CA's
    file, which the command is told to trust (curl --cacert)."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("allowed.test")
    ca_file = places["www"].parent / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    handler = lambda *a: _Handler(*a, directory=str(places["www"]))  # noqa: E731
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
    server.daemon_threads = True
    server.server_bind()
    server.server_activate()
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], ca_file
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def server(places: dict[str, pathlib.Path], http_port: int) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        places["state"], "--network", "allow",
        "--egress-allow", "allowed.test", "--egress-allow", "127.0.0.1/32",
        "--egress-resolve", "allowed.test=127.0.0.1", "--egress-resolve", "other.test=127.0.0.1",
        "--egress-secret", "API_TOKEN@allowed.test=EGS_TEST_TOKEN",
        root=places["root"], env={"HOME": str(places["home"]), "EGS_TEST_TOKEN": SECRET},
    ).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert not any(SECRET in line for line in srv.raw_stderr), "the secret's value reached the service's log"


async def _run(client: Client, command: str) -> tuple[int, str, str, list[pb.LogEvent]]:
    out, err, code, logs = "", "", None, []
    async for ev in client.shell_exec(command):
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


def _audit(srv: ServerProcess) -> list[dict[str, Any]]:
    lines = []
    for line in srv.raw_stderr:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "egress":
            lines.append(entry)
    return lines


# -- what works ---------------------------------------------------------------------------------


async def test_an_allowed_host_works_with_curl_urllib_and_the_service_says_so(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        ready = await client.handshake()
        assert ready.service_info["smith_fast.network"] == "allow"
        assert ready.service_info["smith_fast.egress_allow"] == "allowed.test,127.0.0.1/32"
        code, out, err, _ = await _run(client, f"curl -sSf http://allowed.test:{http_port}/hello")
        assert code == 0 and out == "hello from allowed.test\n", err
        code, out, err, _ = await _run(
            client, f"{PY} -c 'import urllib.request; print(urllib.request.urlopen(\"http://allowed.test:{http_port}/hello\").read().decode(), end=\"\")'")
        assert code == 0 and out == "hello from allowed.test\n", err
    record = next(r for r in _audit(server) if r.get("host") == "allowed.test" and r.get("allowed"))
    assert record["port"] == http_port and record["bytes_down"] > 0 and record["bytes_up"] > 0 and record["request_id"]


async def test_pip_installs_from_a_local_index(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(
            client, f"{PY} -m pip download --no-cache-dir --no-deps --disable-pip-version-check -q -d wheels "
                    f"--trusted-host allowed.test --index-url http://allowed.test:{http_port}/simple tinypkg && ls wheels")
        assert code == 0 and WHEEL in out, err
        code, out, err, _ = await _run(
            client, f"{PY} -m pip install --no-cache-dir --disable-pip-version-check -q --target site "
                    f"--trusted-host allowed.test --index-url http://allowed.test:{http_port}/simple tinypkg && PYTHONPATH=site {PY} -c 'import tinypkg; print(tinypkg.VALUE)'")
        assert code == 0 and out.strip().endswith("42"), err


async def test_git_clones_over_http(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, f"rm -rf clone && git clone -q http://allowed.test:{http_port}/repo.git clone && cat clone/README")
        assert code == 0 and out == "cloned through the proxy\n", err


async def test_a_tcp_echo_through_connect_and_socks(server: ServerProcess, echo_port: int, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, f"printf ping | socat - PROXY:127.0.0.1:allowed.test:{echo_port},proxyport=3128")
        assert code == 0 and out == "echo:ping", err
        code, out, err, _ = await _run(client, f"curl -sSf --proxy \"$ALL_PROXY\" http://allowed.test:{http_port}/hello")
        assert code == 0 and out == "hello from allowed.test\n", err  # SOCKS5, the name resolved by the proxy


# -- what is refused ----------------------------------------------------------------------------


async def test_a_name_not_allowed_is_refused_and_the_peer_is_told(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, logs = await _run(client, f"curl -sSf http://other.test:{http_port}/hello")
        assert code != 0 and "hello" not in out
        refusal = next(log for log in logs if log.fields.get("reason") == "egress_refused")
        assert refusal.fields["host"] == "other.test" and refusal.fields["port"] == str(http_port)
        assert refusal.fields["rule"] == "not-allowed"
        code, out, err, _ = await _run(client, f"curl -sS -o /dev/null -w '%{{http_code}}' http://other.test:{http_port}/hello")
        assert out == "403", (out, err)  # the proxy's own answer, on the command's side
    assert any(r.get("host") == "other.test" and r["allowed"] is False for r in _audit(server))


@pytest.mark.parametrize("target", ["169.254.169.254", "10.1.2.3", "192.168.1.1"])
async def test_special_and_unlisted_addresses_are_refused(server: ServerProcess, target: str) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, logs = await _run(client, f"curl -sSf -m 5 http://{target}/latest/meta-data/")
        assert code != 0 and out == "", out
        assert any(log.fields.get("host") == target for log in logs)
        # and without the proxy there is no route at all
        code, out, err, _ = await _run(client, f"curl -sS -m 5 --noproxy '*' http://{target}/")
        assert code != 0 and "Couldn't connect" in err or "unreachable" in err.lower(), err


async def test_raw_sockets_and_the_hosts_loopback_are_out_of_reach(server: ServerProcess, http_port: int, echo_port: int) -> None:
    host_ip = next((a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET) if not a[4][0].startswith("127.")), "10.0.0.1")
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        for address, port in ((host_ip, http_port), ("127.0.0.1", http_port), ("127.0.0.1", echo_port), ("1.1.1.1", 443)):
            code, out, err, _ = await _run(
                client, f"{PY} -c 'import socket; socket.create_connection((\"{address}\", {port}), timeout=3); print(\"connected\")'")
            assert code != 0 and "connected" not in out, (address, out, err)
        # DNS: the sandbox has no resolver of its own to reach
        code, out, err, _ = await _run(client, f"{PY} -c 'import socket; print(socket.getaddrinfo(\"example.com\", 80))'")
        assert code != 0, out


async def test_a_unix_socket_outside_the_workspace_is_refused(server: ServerProcess, host_socket: str,
                                                             places: dict[str, pathlib.Path]) -> None:
    (places["root"] / "unix_connect.py").write_text(
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1]); print(s.recv(100))\n"
        "except OSError as e:\n    print(e.errno)\n")
    (places["root"] / "unix_own.py").write_text(
        "import os, socket, threading\ns = socket.socket(socket.AF_UNIX); s.bind('own.sock'); s.listen()\n"
        "threading.Thread(target=lambda: s.accept()[0].sendall(b'own'), daemon=True).start()\n"
        "c = socket.socket(socket.AF_UNIX); c.connect(os.path.abspath('own.sock')); print(c.recv(10).decode())\n"
        "def again():\n    c = socket.socket(socket.AF_UNIX); c.connect('own.sock')\n    print('from a thread too')\n"
        "threading.Thread(target=lambda: s.accept(), daemon=True).start()\n"
        "t = threading.Thread(target=again); t.start(); t.join(); os.unlink('own.sock')\n")
    (places["root"] / "unix_dgram.py").write_text(
        "import socket, sys\nfor typ in (socket.SOCK_DGRAM, socket.SOCK_RAW):\n    try:\n"
        "        socket.socketpair(socket.AF_UNIX, typ)[0].sendto(b'x', sys.argv[1]); print('sent')\n"
        "    except OSError as e:\n        print(e.errno)\n"
        "socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'x', sys.argv[1])\n")
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, f"curl -sS --unix-socket {host_socket} http://x/")
        assert code != 0 and "HOST-SERVICE" not in out, out
        code, out, err, _ = await _run(client, f"socat - UNIX-CONNECT:{host_socket} </dev/null")
        assert code != 0 and "HOST-SERVICE" not in out, out
        code, out, err, _ = await _run(client, f"{PY} unix_connect.py {host_socket}")
        assert out.strip() == "13", (out, err)  # EACCES
        # a symlink in the workspace that leads to it, and a datagram sent to it, do no better
        code, out, err, _ = await _run(client, f"ln -sf {host_socket} link.sock && curl -sS --unix-socket link.sock http://x/; rm -f link.sock")
        assert "HOST-SERVICE" not in out, out
        code, out, err, _ = await _run(client, f"{PY} unix_dgram.py {host_socket}")
        assert code != 0 and out == "13\n13\n" and "PermissionError" in err, (out, err)
        code, out, err, _ = await _run(client, f"ln {host_socket} hard.sock")  # another mount: EXDEV
        assert code != 0 and not (places["root"] / "hard.sock").exists(), err
        # a socket of its own in the workspace still works
        code, out, err, _ = await _run(client, f"{PY} unix_own.py")
        assert code == 0 and out == "own\nfrom a thread too\n", err


_OWN_SOCKET = """import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX); s.bind("own.sock"); s.listen()
threading.Thread(target=lambda: s.accept()[0].sendall(b"own"), daemon=True).start()
c = socket.socket(socket.AF_UNIX); c.connect(os.path.abspath("own.sock")); print(c.recv(10).decode(), os.getcwd())
outside = socket.socket(socket.AF_UNIX)
try:
    outside.connect(sys.argv[1]); print(outside.recv(100))
except OSError as e:
    print(e.errno)
"""


async def test_a_workspace_session_gets_the_proxy_and_its_own_sockets(places: dict[str, pathlib.Path], http_port: int,
                                                                      host_socket: str) -> None:
    """--workspaces with --network allow: a command of a workspace session reaches an allowed host and
    is refused a denied one; the unix guard lets it connect to a socket made in its workspace (the
    session's own directory, not --root) and refuses one outside."""
    state = places["state"] / "ws"
    state.mkdir(exist_ok=True)
    srv = ServerProcess(
        state, "--workspaces", str(state / "workspaces"), "--network", "allow",
        "--egress-allow", "allowed.test", "--egress-allow", "127.0.0.1/32",
        "--egress-resolve", "allowed.test=127.0.0.1", "--egress-resolve", "other.test=127.0.0.1",
        root=places["root"], env={"HOME": str(places["home"])},
    ).start()
    try:
        async with await Client.connect(srv.unix) as client:
            ready = await client.handshake(["shell_exec", "workspaces"])
            workspace = ready.service_info["smith_fast.workspace"]
            assert ready.service_info["smith_fast.network"] == "allow" and workspace
            code, out, err, _ = await _run(client, f"curl -sSf http://allowed.test:{http_port}/hello")
            assert code == 0 and out == "hello from allowed.test\n", err
            code, out, err, logs = await _run(client, f"curl -sSf http://other.test:{http_port}/hello")
            assert code != 0 and "hello" not in out
            assert any(log.fields.get("rule") == "not-allowed" and log.fields.get("host") == "other.test" for log in logs), logs
            code, out, err, _ = await _run(client, f"cat > own.py <<'EOF'\n{_OWN_SOCKET}EOF\n{PY} own.py {host_socket}; rm -f own.sock")
            assert code == 0, (out, err)
            own, refused = out.splitlines()
            assert own.split()[0] == "own" and refused == "13", out  # EACCES outside the workspace
            assert not (places["root"] / "own.py").exists()  # it ran in the session's workspace, not --root
        assert any(r.get("host") == "allowed.test" and r.get("allowed") for r in _audit(srv))
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


# -- secrets, hooks, narrowing ----------------------------------------------------------------------


async def test_https_through_connect_with_a_test_ca_and_the_secret_stays_a_placeholder(
        server: ServerProcess, https: tuple[int, pathlib.Path]) -> None:
    """HTTPS is a CONNECT tunnel: the certificate is the host's own (the command verifies it against
    the test CA, no interception), and the proxy cannot rewrite headers inside TLS, so a secret sent
    over HTTPS arrives as its placeholder, never as the value (README, "Network egress")."""
    port, ca_file = https
    _Handler.seen.clear()
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, f"curl -sSf --cacert {ca_file} https://allowed.test:{port}/hello")
        assert code == 0 and out == "hello from allowed.test\n", err
        code, out, err, _ = await _run(
            client, f"curl -sSf --cacert {ca_file} -H \"Authorization: Bearer $API_TOKEN\" https://allowed.test:{port}/headers")
        assert code == 0, err
        seen = _Handler.seen[-1]["Authorization"]
        assert seen.startswith("Bearer ") and SECRET not in seen and seen != "Bearer "
        # a name not allowed is refused before any TLS, whatever the CA says
        code, out, err, logs = await _run(client, f"curl -sS --cacert {ca_file} https://other.test:{port}/hello")
        assert code != 0 and any("other.test" in log.message for log in logs), (out, err)
    def tunnels() -> list[dict[str, Any]]:
        return [r for r in _audit(server) if r.get("host") == "allowed.test" and r.get("port") == port]

    assert await asyncio.to_thread(wait_until, lambda: len(tunnels()) >= 2, 10), _audit(server)
    assert all(r["allowed"] and r["via"] == "connect" and r["bytes_down"] > 0 for r in tunnels())


async def test_a_secret_reaches_its_host_and_nowhere_else(server: ServerProcess, http_port: int) -> None:
    _Handler.seen.clear()
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, "env")
        assert code == 0 and SECRET not in out
        placeholder = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("API_TOKEN="))
        assert placeholder and placeholder != SECRET
        assert "HTTP_PROXY=http://127.0.0.1:3128" in out and "http_proxy=http://127.0.0.1:3128" in out
        # to its host: the real value arrives, and echoed back the proxy puts the placeholder back
        code, out, err, _ = await _run(client, f"curl -sS -H \"Authorization: Bearer $API_TOKEN\" http://allowed.test:{http_port}/headers")
        assert code == 0 and SECRET not in out and json.loads(out)["Authorization"] == f"Bearer {placeholder}", (out, err)
        assert _Handler.seen[-1]["Authorization"] == f"Bearer {SECRET}"
        # to another destination (the same server by its address): the placeholder, never the value
        code, out, err, _ = await _run(
            client, f"curl -sS --noproxy '' -x \"$HTTP_PROXY\" -H \"Authorization: Bearer $API_TOKEN\" http://127.0.0.1:{http_port}/headers")
        assert code == 0 and placeholder in out, (out, err)
        assert _Handler.seen[-1]["Authorization"] == f"Bearer {placeholder}"
    assert not any(SECRET in json.dumps(r) for r in _audit(server))


@pytest.mark.parametrize("path", ["/echo-chunked", "/echo-length"])
async def test_a_host_echoing_the_secret_in_pieces_gives_the_command_its_placeholder(
        server: ServerProcess, http_port: int, path: str) -> None:
    """The command never holds the value: the proxy reads the response of a host that got secrets
    and puts each placeholder back, across reads and chunks (the output's own redaction, which
    would say ``[secret API_TOKEN]``, has nothing to do)."""
    _Handler.seen.clear()
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        code, out, err, _ = await _run(client, "printenv API_TOKEN")
        placeholder = out.strip()
        code, out, err, _ = await _run(
            client, f"curl -sS -D /dev/stderr -H \"Authorization: Bearer $API_TOKEN\" http://allowed.test:{http_port}{path}")
        assert code == 0, err
        assert _Handler.seen[-1]["Authorization"] == f"Bearer {SECRET}"  # the real value went out and came back
        assert out == f"got Bearer {placeholder} and Bearer {placeholder}\n", (out, err)
        assert f"X-Echo: Bearer {placeholder}" in err and SECRET not in err and "[secret" not in out + err, err
        assert "Connection: close" in err and "Transfer-Encoding" not in err and "Content-Length" not in err, err


async def test_a_value_split_across_reads_of_the_output_is_redacted(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    """A command that found the value elsewhere (a file here) and prints it in two writes, a pause
    between: two reads of its pipe, each with half the value; stdout, stderr and a terminal alike."""
    (places["root"] / "found.txt").write_text(SECRET)
    script = ("import sys, time\n"
              "value = open('found.txt').read()\n"
              "for out in (sys.stdout, sys.stderr):\n"
              "    out.write('a ' + value[:7]); out.flush(); time.sleep(0.2)\n"
              "    out.write(value[7:] + ' b ' + value[:3]); out.flush(); time.sleep(0.2)\n"
              "    out.write(value[3:] + ' c prompt> '); out.flush(); time.sleep(0.2)\n"
              "    out.write(value[:5])\n")  # the stream ends on the value's start: given out at the end
    (places["root"] / "split.py").write_text(script)
    try:
        async with await Client.connect(server.unix) as client:
            await client.handshake()
            code, out, err, _ = await _run(client, f"{PY} split.py")
            want = f"a [secret API_TOKEN] b [secret API_TOKEN] c prompt> {SECRET[:5]}"
            assert code == 0 and out == want and err == want, (out, err)
            proc = await client.start(f"{PY} split.py 2>&1", pty=(24, 80))
            assert await proc.wait() == 0
            shown = proc.output().stdout.decode()
            assert SECRET not in shown and shown.count("[secret API_TOKEN]") == 4, shown
    finally:
        (places["root"] / "found.txt").unlink()
        (places["root"] / "split.py").unlink()


async def test_a_before_connect_hook_blocks_a_host(server: ServerProcess, http_port: int) -> None:
    hook = ('function beforeConnect(p) {\n'
            '  if (p.host === "allowed.test" && p.session && p.request) return {action: "block", reason: "not today"};\n'
            '  return {action: "allow"};\n}\n')
    async with await Client.connect(server.unix) as client:
        await client.handshake(["shell_exec", "hooks_js"])
        loaded = await client.load_hook("js", hook)
        code, out, err, logs = await _run(client, f"curl -sSf http://allowed.test:{http_port}/hello")
        assert code != 0 and "hello" not in out
        refusal = next(log for log in logs if log.fields.get("reason") == "egress_refused")
        assert refusal.fields["rule"] == f"hook:{json.loads(loaded.action.allowed_data)['hook_id']}" and "not today" in refusal.message
        code, out, err, _ = await _run(client, f"curl -sSf --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:{http_port}/hello")
        assert code == 0 and out == "hello from allowed.test\n", err  # what it does not block goes on


async def test_a_handshake_narrows_and_never_widens(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        ready = await client.handshake(client_info={"smith_fast.egress_allow": '["allowed.test", "pypi.org"]'})
        assert ready.service_info["smith_fast.egress_session_allow"] == "allowed.test,pypi.org"
        # 127.0.0.1 is opened by the operator's address rule, which the session's list does not repeat
        code, out, err, logs = await _run(client, f"curl -sSf http://allowed.test:{http_port}/hello")
        assert code != 0 and any(log.fields.get("rule") == "private-address" for log in logs), (out, err)
    async with await Client.connect(server.unix) as client:
        await client.handshake(client_info={"smith_fast.egress_allow": "allowed.test,other.test,127.0.0.1/32"})
        code, out, err, _ = await _run(client, f"curl -sS http://allowed.test:{http_port}/hello")
        assert code == 0 and out == "hello from allowed.test\n", err
        code, out, err, logs = await _run(client, f"curl -sSf http://other.test:{http_port}/hello")
        assert code != 0 and any(log.fields.get("rule") == "not-allowed" for log in logs)  # listed, never widened


async def test_shell_run_background_and_pty_commands_get_the_proxy_too(server: ServerProcess, http_port: int) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        result = await client.call_tool("shell.run", {"command": f"curl -sSf http://allowed.test:{http_port}/hello"})
        assert result.success and "hello from allowed.test" in json.loads(result.result)["stdout"], result
        proc = await client.start(f"sleep 0.2; curl -sSf http://allowed.test:{http_port}/hello", background=True)
        assert await proc.wait() == 0
        assert b"hello from allowed.test" in proc.output().stdout
        proc = await client.start(f"curl -sSf http://allowed.test:{http_port}/hello", pty=(24, 80))
        assert await proc.wait() == 0
        assert b"hello from allowed.test" in proc.output().stdout


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_peer_sees_a_refused_connection_explained(places: dict[str, pathlib.Path], http_port: int,
                                                               transport: str) -> None:
    """Through `serve --mcp` (the official SDK client): the shell result names each refused
    connection (structuredContent ``egress_refused`` and a text line, for a client that shows the
    model no notification), the proxy's 403 is on the command's stderr, and the refusal's LogEvent
    arrives as a ``notifications/message`` at warning level."""
    from .test_mcp import connect

    where = places["state"] / f"mcp-{transport}"
    where.mkdir(exist_ok=True)
    notes: list[Any] = []

    async def on_log(params: Any) -> None:
        notes.append(params)

    async with connect(transport, where, "--network", "allow", "--egress-allow", "allowed.test", "--egress-allow", "127.0.0.1/32",
                       "--egress-resolve", "allowed.test=127.0.0.1", "--egress-resolve", "other.test=127.0.0.1",
                       logging_callback=on_log) as client:
        result = await client.call_tool("shell", {"command": f"curl -sS http://other.test:{http_port}/hello"})
        sc = result.structured_content
        assert sc is not None and result.is_error is False  # curl printed the 403 page and exited 0
        assert "smith-fast egress: refused other.test" in sc["stdout"] and "not in --egress-allow" in sc["stdout"], sc
        assert sc["egress_refused"] == [{"host": "other.test", "port": str(http_port), "rule": "not-allowed",
                                         "message": f"egress refused: other.test:{http_port}: not in --egress-allow"}], sc
        text = result.content[0].text  # type: ignore[union-attr]
        assert f"[network: egress refused: other.test:{http_port}: not in --egress-allow (rule not-allowed)]" in text, text
        failed = await client.call_tool("shell", {"command": f"curl -sSf http://other.test:{http_port}/hello"})
        assert failed.is_error and "403" in failed.structured_content["stderr"]  # type: ignore[index]
        allowed = await client.call_tool("shell", {"command": f"curl -sSf http://allowed.test:{http_port}/hello"})
        assert allowed.structured_content is not None and allowed.structured_content["egress_refused"] == []
        assert allowed.structured_content["stdout"] == "hello from allowed.test\n"
    refusals = [n for n in notes if isinstance(n.data, dict) and n.data.get("reason") == "egress_refused"]
    assert len(refusals) == 2 and all(n.level == "warning" and n.data["host"] == "other.test" and n.data["rule"] == "not-allowed"
                                      and n.data["requestId"] is not None for n in refusals), notes


# -- start-up ----------------------------------------------------------------------------------------


def test_egress_options_need_network_allow(places: dict[str, pathlib.Path]) -> None:
    srv = ServerProcess(places["state"] / "refused", "--network", "loopback", "--egress-allow", "pypi.org", root=places["root"])
    with pytest.raises(ServerStartError) as info:
        srv.start()
    assert "need --network allow" in str(info.value) and "Traceback" not in str(info.value)


def test_a_secret_from_an_unset_variable_refuses_to_start(places: dict[str, pathlib.Path]) -> None:
    srv = ServerProcess(places["state"] / "unset", "--network", "allow", "--egress-secret", "T@pypi.org=EGS_UNSET_VARIABLE",
                        root=places["root"])
    with pytest.raises(ServerStartError) as info:
        srv.start()
    assert "EGS_UNSET_VARIABLE" in str(info.value) and "Traceback" not in str(info.value)


_BOUNDS_SCRIPT = """
import socket, sys, time
port = int(sys.argv[1])
# a tunnel that carries nothing: closed by the proxy after --egress-idle-timeout
tunnel = socket.create_connection(("127.0.0.1", 3128))
tunnel.sendall(b"CONNECT allowed.test:%d HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n" % port)
assert tunnel.recv(1024).startswith(b"HTTP/1.1 200"), "no tunnel"
start = time.monotonic()
assert tunnel.recv(1024) == b""
print("idle closed after %.1f" % (time.monotonic() - start))
# a client that names nothing: closed after --egress-handshake-timeout
silent = socket.create_connection(("127.0.0.1", 3128))
start = time.monotonic()
assert silent.recv(1024) == b""
print("silent closed after %.1f" % (time.monotonic() - start))
# connections over --egress-max-connections are closed at accept
held = [socket.create_connection(("127.0.0.1", 3128)) for _ in range(2)]
extra = socket.create_connection(("127.0.0.1", 3128))
extra.settimeout(5)
print("third:", extra.recv(1024) == b"")
"""


async def test_the_proxys_bounds_are_options(places: dict[str, pathlib.Path], http_port: int, echo_port: int) -> None:
    """--egress-max-head, --egress-idle-timeout, --egress-handshake-timeout and --egress-max-connections
    applied by a real serve: each bound far below its default, so only the option explains what is seen."""
    (places["state"] / "bounds").mkdir(exist_ok=True)
    srv = ServerProcess(
        places["state"] / "bounds", "--network", "allow",
        "--egress-allow", "allowed.test", "--egress-allow", "127.0.0.1/32", "--egress-resolve", "allowed.test=127.0.0.1",
        "--egress-max-head", "2k", "--egress-idle-timeout", "700ms", "--egress-handshake-timeout", "700ms",
        "--egress-max-connections", "2", root=places["root"], env={"HOME": str(places["home"])},
    ).start()
    (places["root"] / "bounds.py").write_text(_BOUNDS_SCRIPT)
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            code, out, err, _ = await _run(client, f"curl -sS -H 'X-Pad: {'a' * 1000}' http://allowed.test:{http_port}/hello")
            assert code == 0 and out == "hello from allowed.test\n", err
            code, out, err, logs = await _run(
                client, f"curl -sS -o /dev/null -w '%{{http_code}}' -H 'X-Pad: {'a' * 3000}' http://allowed.test:{http_port}/hello")
            assert out == "431", (out, err)
            code, out, err, logs = await _run(client, f"{PY} bounds.py {echo_port}")
            assert code == 0, (out, err)
            idle, silent, third = out.splitlines()
            assert 0.5 < float(idle.split()[-1]) < 3 and 0.5 < float(silent.split()[-1]) < 3, out
            assert third == "third: True", out
            assert any(log.fields.get("rule") == "limit" for log in logs) or any(
                r.get("rule") == "limit" for r in _audit(srv)), logs
    finally:
        (places["root"] / "bounds.py").unlink()
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert any(r.get("rule") == "head-too-large" for r in _audit(srv))


def test_every_bound_reaches_the_proxy() -> None:
    """The five options, each set apart from its default, are the proxy's EgressLimits (the serve test
    above shows four at work; the connect timeout needs a destination that never answers)."""
    from smith_fast.egress import EgressLimits
    from smith_fast.errors import EgressRuleError
    from smith_fast.service.config import Limits, ServiceConfig
    from smith_fast.service.egress import EgressHub

    limits = Limits(egress_max_head=1000, egress_handshake_timeout=1.5, egress_connect_timeout=2.5, egress_idle_timeout=0.0,
                    egress_max_connections=7)
    hub = EgressHub(ServiceConfig(network="allow", limits=limits))
    assert hub.proxy.limits == EgressLimits(max_head=1000, handshake_timeout=1.5, connect_timeout=2.5, idle_timeout=0.0,
                                            max_connections=7)
    assert EgressLimits.within(0.0) is None and EgressLimits.within(2.5) == 2.5  # 0: no timeout
    with pytest.raises(EgressRuleError):
        EgressHub(ServiceConfig(network="allow", limits=Limits(egress_max_connections=0)))


def test_the_worker_takes_the_same_options() -> None:
    done = subprocess.run([PY, "-m", "smith_fast", "worker", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for flag in ("--egress-allow", "--egress-deny", "--egress-secret", "--egress-resolve", "--egress-max-head",
                 "--egress-handshake-timeout", "--egress-connect-timeout", "--egress-idle-timeout", "--egress-max-connections"):
        assert flag in done.stdout
    assert "allow" in done.stdout.split("--network", 1)[1][:200]


def test_the_sandbox_program_refuses_allow_without_its_fd() -> None:
    from smith_fast.sandbox import HELPER

    done = subprocess.run([HELPER, "--network", "allow", "--", "/bin/true"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--network allow goes with --egress-fd FD" in done.stderr


# -- through the NATS gateway: the policy is the worker's ---------------------------------------------


async def test_through_the_gateway_the_policy_is_the_workers(tmp_path_factory: pytest.TempPathFactory, http_port: int) -> None:
    from harness.nats_cluster import Cluster

    tmp = tmp_path_factory.mktemp("egress-nats")
    cluster = Cluster(tmp, workers=1, nats_args=("--presence-interval", "0.3"), worker_args=(
        "--network", "allow", "--egress-allow", "allowed.test", "--egress-allow", "127.0.0.1/32",
        "--egress-resolve", "allowed.test=127.0.0.1", "--egress-resolve", "other.test=127.0.0.1")).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            ready = await client.handshake(client_info={"smith_fast.egress_allow": "allowed.test,127.0.0.1/32"})
            assert ready.service_info["smith_fast.network"] == "allow"
            assert ready.service_info["smith_fast.egress_session_allow"] == "allowed.test,127.0.0.1/32"
            code, out, err, _ = await _run(client, f"curl -sSf http://allowed.test:{http_port}/hello")
            assert code == 0 and out == "hello from allowed.test\n", err
            code, out, err, logs = await _run(client, f"curl -sSf http://other.test:{http_port}/hello")
            assert code != 0 and any(log.fields.get("rule") == "not-allowed" for log in logs)
    finally:
        assert set(cluster.stop().values()) == {0}
