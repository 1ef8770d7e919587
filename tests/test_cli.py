"""The ``smith-fast`` command line, run as a real subprocess."""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import http.server
import json
import pathlib
import re
import socket
import subprocess
import sys
import threading

import pytest

from smith_fast.options import UNITS

from .server import ROOT, ServerProcess

CLI = [sys.executable, "-m", "smith_fast"]


def cli(*args: str, timeout: float = 60, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("command", ["serve", "exec", "call", "ping"])
def test_help_is_complete(command: str) -> None:
    res = cli(command, "--help")
    assert res.returncode == 0
    assert "usage: smith-fast " + command in res.stdout
    for flag in {"serve": ["--stdio", "--unix", "--tcp", "--allow-remote", "--protocol", "--root", "--max-output", "--timeout-ms"],
                 "exec": ["--connect", "--cwd", "--env", "--timeout-ms"],
                 "call": ["--connect", "JSON"],
                 "ping": ["--connect", "--count"]}[command]:
        assert flag in res.stdout, flag


def test_exec_spawned_streams_and_exits_with_code(tmp_path: pathlib.Path) -> None:
    res = cli("exec", "echo to-out; echo to-err >&2; exit 7", cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (7, "to-out\n", "to-err\n")


@pytest.mark.parametrize("protocol", ["v1", "v0"])
def test_exec_call_ping_against_a_server(tmp_path: pathlib.Path, protocol: str) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    srv = ServerProcess(tmp_path).start()
    try:
        res = cli("exec", "--connect", srv.unix, "--protocol", protocol, "--env", "X=42", "echo $X; kill -TERM $$")
        assert res.stdout == "42\n" and res.returncode == 128 + 15
        res = cli("call", "--connect", srv.tcp.removeprefix("tcp:"), "--protocol", protocol, "fs.read", '{"path": "a.txt"}')
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["content"] == "alpha\n"
        res = cli("call", "--connect", srv.unix, "fs.read", '{"path": "../outside"}')
        assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr
        res = cli("call", "--connect", srv.unix, "fs.read", "{bad json")
        assert res.returncode == 2 and "not valid JSON" in res.stderr
        res = cli("ping", "--connect", srv.unix, "--protocol", protocol, "-c", "2")
        assert res.returncode == 0 and res.stdout.count("round trip") == 2
    finally:
        assert srv.stop() == 0


# ---- a Unix tool: the command line, units, pipes, errors -------------------------------------------


def no_traceback(res: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in res.stderr and "Errno 32" not in res.stderr, res.stderr


def test_exec_takes_the_rest_of_the_line_as_the_command(tmp_path: pathlib.Path) -> None:
    (tmp_path / "f.txt").write_text("x\n")
    srv = ServerProcess(tmp_path).start()
    try:
        res = cli("exec", "--connect", srv.unix, "--cwd", str(tmp_path), "ls", "-l", "f.txt")
        assert res.returncode == 0 and res.stdout.startswith("-rw") and res.stdout.rstrip().endswith("f.txt"), res.stderr
        # options after the command are the command's own, as with `ssh host CMD ...`
        res = cli("exec", "--connect", srv.unix, "echo", "one", "two", "--connect", "elsewhere", "--env", "A=1")
        assert (res.returncode, res.stdout) == (0, "one two --connect elsewhere --env A=1\n"), res.stderr
        # one quoted string still works, shell syntax included; `--` lets a command start with -
        res = cli("exec", "--connect", srv.unix, "echo a; echo b")
        assert (res.returncode, res.stdout) == (0, "a\nb\n"), res.stderr
        res = cli("exec", "--connect", srv.unix, "--", "echo", "--cwd")  # `--` ends the options, and is not part of the command
        assert (res.returncode, res.stdout) == (0, "--cwd\n"), res.stderr
        res = cli("exec", "--connect", srv.unix)
        assert res.returncode == 2 and "no command given" in res.stderr
    finally:
        assert srv.stop() == 0


def test_abbreviations_are_off_everywhere() -> None:
    from smith_fast.cli import build_parser

    def parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        return [p, *(q for s in subs for child in s.choices.values() for q in parsers(child))]

    every = parsers(build_parser())
    assert len(every) >= 9 and all(p.allow_abbrev is False for p in every), [p.prog for p in every if p.allow_abbrev]
    # through the real command: a prefix of an option is an error, not the option
    res = cli("exec", "--timeout-m", "100", "true")
    assert res.returncode == 2 and "unrecognized arguments: --timeout-m" in res.stderr
    res = cli("serve", "--max-out", "1k", "--stdio")
    assert res.returncode == 2 and "--max-out" in res.stderr


def test_durations_have_one_convention(tmp_path: pathlib.Path) -> None:
    """Durations are seconds with an optional suffix; --timeout is never --timeout-ms in disguise."""
    srv = ServerProcess(tmp_path, "--idle-timeout", "5m", "--kill-grace", "500ms", "--handshake-timeout", "10").start()
    try:
        res = cli("exec", "--connect", srv.unix, "--timeout", "300ms", "sleep 30")
        assert res.returncode != 0 and "EXECUTION_TIMEOUT" in res.stderr, res.stderr
        res = cli("exec", "--connect", srv.unix, "--timeout", "0.3", "sleep 30")
        assert res.returncode != 0 and "EXECUTION_TIMEOUT" in res.stderr, res.stderr
        res = cli("exec", "--connect", srv.unix, "--timeout-ms", "300", "sleep 30")  # the older spelling still works
        assert res.returncode != 0 and "EXECUTION_TIMEOUT" in res.stderr, res.stderr
        res = cli("exec", "--connect", srv.unix, "--timeout", "10s", "echo in-time")
        assert (res.returncode, res.stdout) == (0, "in-time\n"), res.stderr
        res = cli("exec", "--connect", srv.unix, "--timeout", "soon", "true")
        assert res.returncode == 2 and "invalid duration value: 'soon'" in res.stderr
    finally:
        assert srv.stop() == 0
    for command in ("serve", "exec", "call", "health", "replay", "worker", "gateway"):
        res = cli(command, "--help")
        assert "Durations are seconds with an optional ms/s/m/h suffix" in " ".join(res.stdout.split()), command


def test_a_closed_stdout_ends_quietly(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path).start()
    try:
        proc = subprocess.Popen([*CLI, "exec", "--connect", srv.unix, "seq 1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stderr is not None
        assert [proc.stdout.readline(), proc.stdout.readline()] == ["1\n", "2\n"]
        proc.stdout.close()  # what `| head -2` does
        assert proc.wait(60) == 128 + 13  # as a writer killed by SIGPIPE, seq in `seq 1000000 | head -2`
        stderr = proc.stderr.read()
        assert "Broken pipe" not in stderr and "Traceback" not in stderr, stderr
    finally:
        assert srv.stop() == 0


def test_connection_errors_name_the_address_and_say_what_to_do(tmp_path: pathlib.Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # nobody listens there once closed
    for command in (["exec", "true"], ["call", "tools.list"], ["ping"], ["health"]):
        res = cli(command[0], "--connect", "unix:nope.sock", *command[1:], cwd=tmp_path)
        assert res.returncode == 2, (command, res.stderr)
        assert "cannot connect to unix:nope.sock: no such file (is smith-fast serve running there?)" in res.stderr, (command, res.stderr)
        no_traceback(res)
        res = cli(command[0], "--connect", f"127.0.0.1:{free}", *command[1:])
        assert res.returncode == 2 and f"cannot connect to tcp:127.0.0.1:{free}: connection refused" in res.stderr, (command, res.stderr)
        res = cli(command[0], "--connect", "tcp:localhost:http", *command[1:])
        assert res.returncode == 2 and "address 'tcp:localhost:http' is not tcp:HOST:PORT" in res.stderr, (command, res.stderr)
        no_traceback(res)


def _http_server() -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_a_port_that_speaks_something_else_is_not_a_smith_service(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0").start()
    http_server, http_port = _http_server()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (in the kernel) and never says a word
    try:
        grpc_port = srv.grpc.rpartition(":")[2]
        metrics_port = srv.metrics_url.rstrip("/").rpartition(":")[2].partition("/")[0]
        cases: list[tuple[object, tuple[str, ...]]] = []
        for port in (http_port, grpc_port, metrics_port, silent.getsockname()[1]):
            for command, protocol in ((["exec", "true"], "v1"), (["call", "tools.list"], "v0"), (["ping"], "v1")):
                cases.append((port, (command[0], "--connect", f"127.0.0.1:{port}", "--protocol", protocol, *command[1:])))
            cases.append((port, ("health", f"tcp:127.0.0.1:{port}")))
        cases.append((silent.getsockname()[1], ("exec", "--connect", f"127.0.0.1:{silent.getsockname()[1]}", "true")))
        # side by side: each is a process of its own, and the silent port's wait the handshake's 2 s
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            results = list(pool.map(lambda case: cli(*case[1], timeout=30), cases))
        for (port, args), res in zip(cases, results):
            assert res.returncode == 2 and f"not a Smith service at tcp:127.0.0.1:{port}" in res.stderr, (args, res.stderr)
            no_traceback(res)
        assert "no answer to the handshake within 2s" in results[-1].stderr, results[-1].stderr  # the silent port's
    finally:
        silent.close()
        http_server.shutdown()
        assert srv.stop() == 0


def test_user_errors_print_no_traceback(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path).start()
    try:
        for args, expected in [
            (["call", "--connect", srv.unix, "fs.read", "{bad json"], "not valid JSON"),
            (["call", "--connect", srv.unix, "fs.read", "[1, 2"], "not valid JSON"),
            (["exec", "--connect", srv.unix, "--env", "NOEQUALS", "true"], "is not KEY=VALUE"),
            (["replay", str(tmp_path / "missing.smithrec"), "--print"], "missing.smithrec"),
            (["replay", str(tmp_path / "missing.smithrec"), "--against", "tcp:x"], "missing.smithrec"),
            (["health"], "which service? give --connect ADDR"),
            (["health", "grpc:127.0.0.1:notaport"], "is not grpc:HOST:PORT"),
            (["ping", "--connect", "unix:"], "names no socket path"),
            # an unclosed bracket was read as host "[:" (and shown as tcp:[:]:1), a URL as a socket path
            (["ping", "--connect", "tcp:[::1"], "address 'tcp:[::1' is not tcp:HOST:PORT"),
            (["ping", "--connect", "tcp:::1]:7878"], "is not tcp:HOST:PORT"),
            (["ping", "--connect", "http://127.0.0.1:7878"], "address 'http://127.0.0.1:7878' is a URL"),
            (["ping", "--connect", "127.0.0.1:٨٠"], "is not tcp:HOST:PORT"),
            (["exec", "--connect", srv.unix, "--protocol", "v0", "--timeout", "-1", "true"], "invalid duration"),
        ]:
            res = cli(*args)
            assert res.returncode == 2 and expected in res.stderr, (args, res.stderr)
            no_traceback(res)
    finally:
        assert srv.stop() == 0


def test_a_startup_error_is_printed_once(tmp_path: pathlib.Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (["serve", "--tcp", f"127.0.0.1:{port}"], ["serve", "--root", str(tmp_path / "nope"), "--tcp", "127.0.0.1:0"],
                     ["serve", "--hook", str(tmp_path / "nope.js"), "--tcp", "127.0.0.1:0"], ["serve", "--token", "", "--stdio"]):
            res = cli(*args)
            lines = [line for line in res.stderr.splitlines() if line.strip()]
            assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("smith-fast serve: "), (args, res.stderr)


HELP_COMMANDS = ["serve", "exec", "call", "ping", "health", "replay", "worker", "gateway", "nats-auth", "checkpoint", "restore", "diff", "undo"]


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_help_ends_with_examples(command: str) -> None:
    res = cli(command, "--help")
    assert res.returncode == 0
    head, sep, examples = res.stdout.rpartition("\nexamples:\n")
    assert sep, res.stdout
    lines = [line.strip() for line in examples.splitlines() if line.strip()]
    assert 2 <= len(lines) <= 4 and all(f"smith-fast {command}" in line for line in lines), lines


@pytest.mark.parametrize("command", ["exec", "call", "ping", "health"])
def test_client_commands_take_the_address_the_same_way(command: str) -> None:
    res = cli(command, "--help")
    text = " ".join(res.stdout.split())
    assert "--connect ADDR where the service listens:" in text
    for form in ("unix:PATH", "tcp:HOST:PORT", "HOST:PORT", "grpc:HOST:PORT"):
        assert form in text.partition("--connect ADDR")[2], (command, form)


def test_replay_against_lists_every_address_form() -> None:
    text = " ".join(cli("replay", "--help").stdout.split())
    assert all(form in text.partition("--against ADDR")[2] for form in ("unix:PATH", "tcp:HOST:PORT", "grpc:HOST:PORT"))


async def test_handshake_names_the_valid_capabilities(tmp_path: pathlib.Path) -> None:
    from smith_fast.client import Client

    srv = ServerProcess(tmp_path).start()
    try:
        client = await Client.connect(srv.unix)
        try:
            with pytest.raises(ValueError, match=r"unknown capability 'bogus'; the capabilities are: .*shell_exec"):
                await client.handshake(["shell_exec", "bogus"])
            ready = await client.handshake(["shell_exec"])  # nothing was sent: the session is as new
            assert ready.version == 1
        finally:
            await client.close()
    finally:
        assert srv.stop() == 0


def test_bench_is_not_a_subcommand_and_nothing_imports_it() -> None:
    res = cli("bench", "--help")
    assert res.returncode == 2 and "invalid choice: 'bench'" in res.stderr
    package = ROOT / "smith_fast"
    for path in package.rglob("*.py"):
        if package / "bench" in path.parents:
            continue
        for module in _imports(path):
            assert not module.startswith(("smith_fast.bench", ".bench")), (path, module)


# ---- one option set: each limit defined once, every command's flags generated from it ------------


def _imports(path: pathlib.Path) -> list[str]:
    """Every module ``path`` imports, at any depth (relative ones resolved against the package)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return found


def test_the_nats_commands_do_not_import_the_main_cli() -> None:
    assert not any(m == "smith_fast.cli" for m in _imports(ROOT / "smith_fast" / "nats" / "cli.py"))
    assert not any(m.startswith("smith_fast.cli") for m in _imports(ROOT / "smith_fast" / "startup.py"))


def test_serve_worker_gateway_share_one_default_per_option() -> None:
    from smith_fast.cli import build_parser
    from smith_fast.service.config import Limits
    from smith_fast.startup import service_config

    parser = build_parser()
    nats = ["--nats", "nats://127.0.0.1:4222"]
    built = {c: service_config(parser.parse_args([c, *(nats if c != "serve" else [])]), c) for c in ("serve", "worker", "gateway")}
    for command, config in built.items():
        expected = Limits(max_requests=64) if command == "worker" else Limits()  # worker: --concurrency (64) sets it
        if command == "worker":
            config = service_config(parser.parse_args([command, *nats]), command, max_requests=64)
        assert config.limits == expected, command
    helps = {c: " ".join(cli(c, "--help").stdout.split()) for c in ("serve", "worker", "gateway")}
    for f in dataclasses.fields(Limits):
        opt = f.metadata["option"]
        shown = f"(default {UNITS[opt.unit].show(f.default)})"
        for command in opt.commands:
            assert re.search(re.escape(opt.flag) + r" \S+ [^(]*\(?[^(]*" + re.escape(shown), helps[command]), (command, opt.flag, shown)
    # the one that disagreed: 1M everywhere
    assert all("--max-command-size SIZE" in helps[c] for c in helps)
    assert all(re.search(r"--max-command-size SIZE .*?\(default 1M\)", helps[c]) for c in helps)


def test_readme_limits_table_matches_the_definition() -> None:
    from smith_fast.service.config import Limits

    readme = (ROOT / "README.md").read_text()
    table = readme.partition("## Limits")[2].partition("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`--"):
            rows[cells[0].split("`")[1]] = cells[1]
    for f in dataclasses.fields(Limits):
        opt = f.metadata["option"]
        assert opt.flag in rows, f"README's limits table lacks {opt.flag}"
        assert rows[opt.flag].split()[0] == UNITS[opt.unit].show(f.default), (opt.flag, rows[opt.flag])


def test_size_and_duration_syntax() -> None:
    from smith_fast.options import MAX_DURATION, MAX_SIZE, format_duration, format_size, parse_duration, parse_size

    assert [parse_size(t) for t in ("65536", "64k", "64K", "1.5M", "16MiB", "1G", "2kb")] == [65536, 65536, 65536, 3 << 19, 16 << 20, 1 << 30, 2048]
    assert [parse_duration(t) for t in ("1.5", "500ms", "30s", "2m", "1h", "0")] == [1.5, 0.5, 30.0, 120.0, 3600.0, 0.0]
    for bad in ("", "-1", "5x", "1 2", "k", "1e400", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_size(bad)
        with pytest.raises(ValueError):
            parse_duration(bad)
    # the largest of each is taken, anything beyond is refused (1e400 is infinite: a traceback, and
    # `exec --timeout 1e20` protobuf's "Value out of range" before)
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE and parse_duration(f"{MAX_DURATION:g}") == MAX_DURATION
    for beyond in (str(MAX_SIZE + 1), "8589934592G", "1e19"):
        with pytest.raises(ValueError, match="larger than any size"):
            parse_size(beyond)
    for beyond in ("1e20", "1000000001", "300000h"):
        with pytest.raises(ValueError, match="longer than any duration"):
            parse_duration(beyond)
    assert [format_size(n) for n in (16 << 20, 64 << 10, 1000, 0)] == ["16M", "64k", "1000", "0"]
    assert [format_duration(s) for s in (2.0, 0.5, 300.0, 0)] == ["2s", "500ms", "300s", "0s"]
    for n in (16 << 20, 64 << 10, 1000):
        assert parse_size(format_size(n)) == n


def test_a_duration_or_size_too_large_is_a_usage_error_not_a_traceback(tmp_path: pathlib.Path) -> None:
    for args in (("exec", "--timeout", "1e400", "true"), ("exec", "--timeout", "1e20", "true"), ("serve", "--stdio", "--max-output", "1e400")):
        res = cli(*args, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr and f"invalid {'duration' if 'exec' in args else 'size'} value" in res.stderr, res.stderr


@pytest.mark.parametrize(("path", "why"), [("/nonexistent/dir/smith.sock", "no directory /nonexistent/dir"),
                                            ("/tmp/" + "x" * 120, "AF_UNIX path too long")])
def test_a_unix_socket_that_cannot_be_made_names_its_path_and_why(tmp_path: pathlib.Path, path: str, why: str) -> None:
    res = cli("serve", "--unix", path, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().endswith(f"smith-fast serve: cannot start: --unix {path}: {why}"), res.stderr
