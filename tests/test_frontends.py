"""Real frontends against ``smith-fast serve --mcp``: Claude Code and the Codex CLI (npm packages
pinned in tests/interop/package.json, installed by ``make test``) run headless, spawn our server
over stdio as their MCP server, and talk to a local fake model (harness/fake_models.py) that
calls our tools in a scripted order and records the tool results the frontend sends back: what a
real model would read. Each CLI runs once per module with every step in one conversation (a run
takes about two seconds); the tests then assert on one step's recorded result each.

The same conversation also drives each frontend's built-in shell (Claude Code's ``Bash``, Codex's
``exec_command``) through the same steps, so README's comparison table is checked here too.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.fake_models import FakeModels, Script, Step, ToolResult
from harness.server import ROOT

NODE_BIN = ROOT / "tests" / "interop" / "node_modules" / ".bin"
# What the MCP result budget allows the model to see of one call, with room for the frontend's own
# framing (Codex's "Wall time" line, Claude Code's system reminder).
BUDGET = 30_000
FRAMING = 1_000
CLI_TIMEOUT = 120


def cli(name: str) -> pathlib.Path:
    path = NODE_BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make test` (it runs `npm ci --prefix tests/interop`, which installs {name})")
    return path


def without_reminders(text: str) -> str:
    """A tool result's text without the system reminders Claude Code appends to it."""
    return re.sub(r"\s*<system-reminder>.*?</system-reminder>\s*", "", text, flags=re.DOTALL).strip()


def smith_argv(root: pathlib.Path, state: pathlib.Path) -> list[str]:
    # This checkout's code (python -m from ROOT), not whatever smith-fast is on PATH.
    return [sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(root), "--state-dir", str(state)]


def mcp_steps(outside: pathlib.Path) -> list[Step]:
    """The steps through our MCP server (tools ``shell`` and ``fs.read``)."""
    return [
        Step("shell", {"command": "echo hello"}, "echo"),
        Step("shell", {"command": "exit 3"}, "exit3"),
        Step("shell", {"command": "sleep 5", "timeout": 1}, "timeout"),
        Step("shell", {"command": "seq 100000"}, "seq"),
        Step("shell", {"command": f"echo escaped > {outside}"}, "outside"),
        Step("shell", {"command": "cd sub"}, "cd"),
        Step("shell", {"command": "pwd"}, "pwd"),
        Step("fs.read", {"path": "notes.txt"}, "read"),
    ]


def claude_builtin_steps(outside: pathlib.Path, root: pathlib.Path) -> list[Step]:
    return [
        Step("Bash", {"command": "echo hello", "description": "echo"}, "b-echo"),
        Step("Bash", {"command": "exit 3", "description": "exit"}, "b-exit3"),
        Step("Bash", {"command": "sleep 5", "timeout": 1000, "description": "sleep"}, "b-timeout"),
        Step("Bash", {"command": "seq 100000", "description": "seq"}, "b-seq"),
        Step("Bash", {"command": f"echo escaped > {outside}", "description": "escape"}, "b-outside"),
        Step("Bash", {"command": "cd sub", "description": "cd"}, "b-cd"),
        Step("Bash", {"command": "pwd", "description": "pwd"}, "b-pwd"),
        Step("Read", {"file_path": str(root / "notes.txt")}, "b-read"),
    ]


def codex_builtin_steps(outside: pathlib.Path) -> list[Step]:
    # exec_command has no timeout: yield_time_ms is how long it waits before answering with a
    # session id (the command goes on running); Codex has no file-read tool but the shell.
    return [
        Step("exec_command", {"cmd": "echo hello"}, "b-echo"),
        Step("exec_command", {"cmd": "exit 3"}, "b-exit3"),
        Step("exec_command", {"cmd": "sleep 5", "yield_time_ms": 1000}, "b-timeout"),
        Step("exec_command", {"cmd": "seq 100000"}, "b-seq"),
        Step("exec_command", {"cmd": f"echo escaped > {outside}"}, "b-outside"),
        Step("exec_command", {"cmd": "cd sub"}, "b-cd"),
        Step("exec_command", {"cmd": "pwd"}, "b-pwd"),
        Step("exec_command", {"cmd": "cat notes.txt"}, "b-read"),
    ]


@dataclass
class Run:
    """One frontend's run: its recorded script, the process's output, the paths the steps used."""

    frontend: str
    script: Script
    proc: subprocess.CompletedProcess[str]
    seconds: float
    root: pathlib.Path
    outside: pathlib.Path
    builtin_outside: pathlib.Path

    def result(self, label: str) -> ToolResult:
        try:
            return self.script.result(label)
        except AssertionError as exc:
            raise AssertionError(f"{self.frontend}: {exc}\nstdout:\n{self.proc.stdout[-3000:]}\nstderr:\n{self.proc.stderr[-3000:]}") from None

    def text(self, label: str) -> str:
        return without_reminders(self.result(label).text)


def workspace(base: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("a note from the workspace\n")
    home = base / "home"
    home.mkdir()
    return root, home, base / "state"


@pytest.fixture(scope="module")
def outside_dir() -> Iterator[pathlib.Path]:
    """A directory outside the root and outside /tmp (sandboxed commands get a /tmp of their own,
    and Codex lets its commands write /tmp): a write there is one the sandbox must refuse. Under
    /var/tmp, not the checkout: a clone may itself lie under /tmp."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-frontends-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def quiet_env(home: pathlib.Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModels]:
    with FakeModels() as models:
        yield models


def claude_env(home: pathlib.Path, fake: FakeModels) -> dict[str, str]:
    return {
        **quiet_env(home),
        "ANTHROPIC_BASE_URL": fake.anthropic_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake-key",
        # No update checks, telemetry, error reports or other calls home: there is no network.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        # MCP tools are otherwise deferred behind ToolSearch, and the fake model calls them directly.
        "ENABLE_TOOL_SEARCH": "false",
    }


@pytest.fixture(scope="module")
def claude_home(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels) -> tuple[pathlib.Path, dict[str, str]]:
    """A HOME where ``claude mcp add`` configured our server (user scope), as README says to."""
    base = tmp_path_factory.mktemp("claude")
    root, home, state = workspace(base)
    env = claude_env(home, fake)
    # Claude Code starts the server in the project (root), so PYTHONPATH points it at this checkout.
    added = subprocess.run([str(cli("claude")), "mcp", "add", "smith", "--scope", "user", "-e", f"PYTHONPATH={ROOT}", "--", *smith_argv(root, state)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert added.returncode == 0, added.stderr + added.stdout
    return base, env


@pytest.fixture(scope="module")
def claude_run(claude_home: tuple[pathlib.Path, dict[str, str]], fake: FakeModels, outside_dir: pathlib.Path) -> Run:
    base, env = claude_home
    root, outside, builtin_outside = base / "root", outside_dir / "claude-mcp.txt", outside_dir / "claude-builtin.txt"
    script = fake.script("claude", mcp_steps(outside) + claude_builtin_steps(builtin_outside, root))
    allowed = "mcp__smith__shell mcp__smith__fs_read Bash Read"
    started = time.monotonic()
    proc = subprocess.run(
        [str(cli("claude")), "-p", "Run the steps. [script:claude]", "--allowedTools", allowed, "--model", "claude-sonnet-4-5",
         "--output-format", "json", "--no-session-persistence"],
        cwd=root, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )
    run = Run("claude", script, proc, time.monotonic() - started, root, outside, builtin_outside)
    assert proc.returncode == 0, f"claude failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return run


@pytest.fixture(scope="module")
def codex_run(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels, outside_dir: pathlib.Path) -> Run:
    base = tmp_path_factory.mktemp("codex")
    root, home, state = workspace(base)
    outside, builtin_outside = outside_dir / "codex-mcp.txt", outside_dir / "codex-builtin.txt"
    codex_home = base / "codex-home"
    codex_home.mkdir()
    argv = smith_argv(root, state)
    # approval_policy "never" and the server's default_tools_approval_mode "approve": `codex exec`
    # has nobody to ask, so an MCP tool that may write (ours do) would otherwise be refused.
    (codex_home / "config.toml").write_text(
        f"""model = "gpt-fake"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.fake]
name = "fake"
base_url = {json.dumps(fake.openai_url)}
env_key = "FAKE_OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[mcp_servers.smith]
command = {json.dumps(argv[0])}
args = {json.dumps(argv[1:])}
cwd = {json.dumps(str(ROOT))}
required = true
default_tools_approval_mode = "approve"
"""
    )
    script = fake.script("codex", mcp_steps(outside) + codex_builtin_steps(builtin_outside))
    env = {**quiet_env(home), "CODEX_HOME": str(codex_home), "FAKE_OPENAI_API_KEY": "sk-fake-key"}
    started = time.monotonic()
    proc = subprocess.run(
        [str(cli("codex")), "exec", "--skip-git-repo-check", "Run the steps. [script:codex]"],
        cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )
    run = Run("codex", script, proc, time.monotonic() - started, root, outside, builtin_outside)
    assert proc.returncode == 0, f"codex failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return run


@pytest.fixture(params=["claude", "codex"])
def run(request: pytest.FixtureRequest) -> Run:
    value: Run = request.getfixturevalue(f"{request.param}_run")
    return value


def exit_code_shown(text: str, code: int) -> bool:
    """The text tells the exit code: ``"exit_code":3``, ``exit code 3``, ``exited with code 3``."""
    return re.search(rf'exit(?:_code"?:\s*|(?:ed with)? code\s+){code}\b', text, re.IGNORECASE) is not None


# ---- through our MCP server ------------------------------------------------------------------

def test_echo(run: Run) -> None:
    result = run.result("echo")
    assert result.tool_name == "mcp__smith__shell"
    assert "hello" in run.text("echo") and exit_code_shown(run.text("echo"), 0)
    assert result.is_error in (False, None)


def test_exit_code_is_an_error(run: Run) -> None:
    """A command that fails is a failed call: Claude Code sends the model ``is_error``; the
    Responses API has no such flag, so with Codex the exit code in the text is all there is."""
    assert exit_code_shown(run.text("exit3"), 3), run.text("exit3")
    if run.frontend == "claude":
        assert run.result("exit3").is_error is True, run.result("exit3").raw


def test_timeout(run: Run) -> None:
    result = run.result("timeout")
    assert result.seconds < 4, f"sleep 5 with timeout 1 took {result.seconds:.1f} s"
    assert re.search(r"tim(?:ed|e)[ _-]?out", run.text("timeout"), re.IGNORECASE), run.text("timeout")
    if run.frontend == "claude":
        assert result.is_error is True


def test_large_output_is_bounded_and_kept_in_a_file(run: Run) -> None:
    """``seq 100000`` (588,895 bytes): the model gets the head and the tail within the budget,
    and the name of the file holding all of it; not the frontend's own diversion of an oversized
    result (Claude Code saves one to its own file and says the result "exceeds maximum allowed
    tokens"; Codex cuts out the middle)."""
    text = run.text("seq")
    print(f"seq 100000 reached the {run.frontend} model as {len(text)} characters")
    assert len(text) < BUDGET + FRAMING, len(text)
    assert "exceeds maximum allowed tokens" not in text, text[:500]
    assert re.search(r"\b1(?:\\n|\n)2(?:\\n|\n)3\b", text) and "100000" in text, (text[:200], text[-200:])
    assert re.search(r"/[\w.+-]+/[\w.+/-]+", text), f"no file named: {text[:300]} … {text[-300:]}"


def test_sandbox_refuses_a_write_outside_the_root(run: Run) -> None:
    text = run.text("outside")
    assert not run.outside.exists()
    assert "Read-only file system" in text or "Permission denied" in text, text
    assert not exit_code_shown(text, 0), text


def test_cwd_is_kept_between_calls(run: Run) -> None:
    assert exit_code_shown(run.text("cd"), 0), run.text("cd")
    assert re.search(re.escape(str(run.root / "sub")) + r"(\\n|\n|\"|$)", run.text("pwd")), run.text("pwd")


def test_fs_read(run: Run) -> None:
    result = run.result("read")
    assert result.tool_name == "mcp__smith__fs_read"
    assert "a note from the workspace" in run.text("read")
    assert result.is_error in (False, None)


def test_claude_mcp_list_shows_the_server_connected(claude_home: tuple[pathlib.Path, dict[str, str]]) -> None:
    base, env = claude_home
    listed = subprocess.run([str(cli("claude")), "mcp", "list"], cwd=base / "root", env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert listed.returncode == 0, listed.stderr
    line = next((line for line in listed.stdout.splitlines() if line.startswith("smith:")), "")
    assert "serve --mcp" in line and "✔ Connected" in line, listed.stdout


def test_runs_are_quick(run: Run) -> None:
    """A whole conversation (16 tool calls, one of them a 1 s timeout) stays a few seconds, so the
    module costs the suite little; the CLIs must not wait on a network they cannot reach."""
    assert run.seconds < 30, run.seconds
    assert run.script.finished and run.script.errors == []


# ---- the frontends' built-in shells, for README's comparison ---------------------------------

def test_claude_code_bash(claude_run: Run) -> None:
    """Claude Code's Bash: is_error with "Exit code N", its own timeout, a large output saved to a
    file under ~/.claude with a 2 KB preview, the cwd kept, no sandbox (the write outside lands)."""
    run = claude_run
    assert run.text("b-echo") == "hello"
    assert run.result("b-exit3").is_error is True and run.text("b-exit3") == "Exit code 3"
    assert run.result("b-timeout").is_error is True and "timed out" in run.text("b-timeout")
    seq = run.text("b-seq")
    assert len(seq) < 3000 and "Full output saved to: " + str(run.root.parent / "home" / ".claude") in seq
    assert run.builtin_outside.read_text() == "escaped\n"
    assert run.text("b-pwd") == str(run.root / "sub")
    assert "a note from the workspace" in run.text("b-read")


def test_codex_exec_command(codex_run: Run) -> None:
    """Codex's exec_command: "Process exited with code N" and no error flag, no timeout (after
    yield_time_ms it answers with a session id while the command runs on), a large output cut to
    its head and tail (about 10,000 characters), each call in a fresh shell (cd is not kept), its
    sandbox refusing the write outside."""
    run = codex_run
    assert "Process exited with code 0" in run.text("b-echo") and run.text("b-echo").endswith("hello")
    assert "Process exited with code 3" in run.text("b-exit3")
    assert "Process running with session ID" in run.text("b-timeout")
    seq = run.text("b-seq")
    assert len(seq) < 12_000 and "truncated output" in seq and seq.endswith("100000")
    assert not run.builtin_outside.exists() and "Read-only file system" in run.text("b-outside")
    assert run.text("b-pwd").endswith(str(run.root))
    assert run.text("b-read").endswith("a note from the workspace")
