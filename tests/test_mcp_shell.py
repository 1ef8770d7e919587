"""The MCP ``shell`` tool as frontends show it, through the official SDK over stdio and HTTP: the facts
in structuredContent (checked by the SDK against outputSchema), isError, the output budget and the
whole output read back with fs.read by lines, the directory and exports kept between calls, the
instructions, what tools/list shows, and a cancel that logs nothing at error level."""

from __future__ import annotations

import json
import pathlib
import random
import subprocess

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.client.client import Client

from harness.server import wait_until
from tests.test_mcp import connect

TRANSPORTS = ["stdio", "http"]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _shell(client: Client, arguments: dict[str, object]) -> tuple[dict[str, object], str, bool]:
    result = await client.call_tool("shell", arguments)
    assert result.structured_content is not None
    return result.structured_content, result.content[0].text, bool(result.is_error)  # type: ignore[union-attr]


async def test_failures_are_errors_with_their_facts(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path, "--env-policy", "denylist") as client:
        sc, text, err = await _shell(client, {"command": "echo out; exit 3"})
        assert err and sc["exit_code"] == 3 and sc["stdout"] == "out\n" and "[exit code 3]" in text
        sc, text, err = await _shell(client, {"command": "true"})
        assert not err and sc["exit_code"] == 0 and not sc["killed"] and not sc["refused"]
        sc, text, err = await _shell(client, {"command": "sleep 30", "timeout": 0.3})
        assert err and sc["timed_out"] is True and sc["killed"] is True and sc["kill_reason"] == "timeout after 0.3 s"
        assert "timed out" in text
        sc, text, err = await _shell(client, {"command": "sleep 1", "timeout": 10_000})
        assert not err and sc["timeout_capped"] is True and sc["timeout_s"] == 600
        sc, text, err = await _shell(client, {"command": "kill -9 $$"})
        assert err and sc["killed"] is True and sc["signal"] == 9 and sc["kill_reason"] == "SIGKILL"
        # refused before it runs: the env policy, and the sandbox's cwd rule
        sc, text, err = await _shell(client, {"command": "echo never", "env": {"LD_PRELOAD": "/x.so"}})
        assert err and sc["refused"] is True and sc["refusal"] == "env_refused" and sc["exit_code"] is None
        assert "LD_PRELOAD" in text and "refused (env_refused)" in text
        sc, text, err = await _shell(client, {"command": "echo never", "cwd": "/etc"})
        assert err and sc["refused"] is True and sc["refusal"] == "cwd_outside_root"


async def test_long_output_is_cut_and_kept_whole(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path) as client:
        result = await client.call_tool("shell", {"command": "seq 100000"})
        sc = result.structured_content
        assert sc is not None and not result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert len(text) <= 30_000 and len(sc["stdout"]) <= 30_000
        assert sc["stdout"].startswith("1\n2\n3\n") and sc["stdout"].endswith("99999\n100000\n")
        cut = sc["cut"]["stdout"]
        assert sc["truncated"] is True and cut["total_lines"] == 100000 and cut["total_bytes"] == sc["stdout_bytes"] == 588895
        assert f"{cut['cut_lines']} lines ({cut['cut_bytes']} bytes) cut here" in sc["stdout"]
        path = sc["output_file"]
        assert path == cut["file"] and path in sc["stdout"] and path in text
        assert not path.startswith(str(tmp_path))  # nothing written into the root
        read = await client.call_tool("fs.read", {"path": path, "offset": 50000, "limit": 3})
        assert not read.is_error, read.content
        got = json.loads(read.content[0].text)  # type: ignore[union-attr]
        assert got["content"] == "50000\n50001\n50002\n" and got["lines"] == 3 and got["next_offset"] == 50003
        assert read.structured_content == got
        last = json.loads((await client.call_tool("fs.read", {"path": path, "offset": 99999, "limit": 10})).content[0].text)  # type: ignore[union-attr]
        assert last["content"] == "99999\n100000\n" and last["next_offset"] is None
        # fs.read's byte reads are unchanged
        whole = json.loads((await client.call_tool("fs.read", {"path": path, "offset": 2, "length": 4})).content[0].text)  # type: ignore[union-attr]
        assert whole["content"] == "2\n3\n"


async def test_directory_and_exports_carry_over(transport: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "sub").mkdir()
    async with connect(transport, tmp_path) as client:
        sc, text, _ = await _shell(client, {"command": "cd sub"})
        assert sc["cwd"] == str(tmp_path / "sub") and f"[cwd: {tmp_path / 'sub'}]" in text
        sc, _, _ = await _shell(client, {"command": "pwd"})
        assert sc["stdout"] == f"{tmp_path / 'sub'}\n"
        await _shell(client, {"command": "export X=1"})
        sc, _, _ = await _shell(client, {"command": "echo $X"})
        assert sc["stdout"] == "1\n"
        # exit inside the command, and a command that changes directory and then fails
        sc, _, err = await _shell(client, {"command": "cd /; export Y=2; exit 4"})
        assert err and sc["exit_code"] == 4 and sc["cwd"] == "/" and sc["state_saved"] is True
        sc, _, _ = await _shell(client, {"command": "echo $X$Y; pwd"})
        assert sc["stdout"] == "12\n/\n"
        sc, _, _ = await _shell(client, {"command": "echo \"[$X$Y]\"; pwd", "fresh": True})
        assert sc["stdout"] == f"[]\n{tmp_path}\n"
        sc, _, _ = await _shell(client, {"command": "echo \"[$X]\""})
        assert sc["stdout"] == "[]\n"
        # a variable the env policy refuses is not carried (it would refuse every later call)
        sc, text, err = await _shell(client, {"command": "export LD_PRELOAD=/nothing.so Z=3"})
        assert not err and sc["env_not_kept"] == ["LD_PRELOAD"]
        sc, _, err = await _shell(client, {"command": "echo $Z"})
        assert not err and sc["stdout"] == "3\n"


async def test_instructions_and_listing(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path) as client:
        text = client.instructions
        assert text is not None and str(tmp_path) in text and "Sandbox workspace-write" in text
        assert "30000 characters" in text and "120 s" in text and "working directory" in text
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["fs.list", "fs.read", "fs.search", "fs.write", "shell"]
        with pytest.raises(Exception, match="unknown tool"):
            await client.call_tool("shell.run", {"command": "true"})
    async with connect(transport, tmp_path, "--mcp-expose-all-tools") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "shell.run" in names and "tools.list" in names


async def test_cancel_logs_no_error(transport: str, tmp_path: pathlib.Path) -> None:
    logs: list[str] = []

    async def on_log(params: object) -> None:
        logs.append(str(getattr(params, "level", "")))

    marker = tmp_path / "started"
    async with connect(transport, tmp_path, logging_callback=on_log) as client:
        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await client.call_tool("shell", {"command": f"touch {marker}; exec sleep 60"})

                tg.start_soon(call)
                assert await anyio.to_thread.run_sync(lambda: wait_until(marker.exists, 20))
                tg.cancel_scope.cancel()
        await anyio.sleep(1.5)  # the kill and its events come after the cancel
        after = await client.call_tool("shell", {"command": "echo on"})
        assert after.structured_content is not None and after.structured_content["stdout"] == "on\n"
    assert "error" not in logs, logs


@pytest.mark.parametrize("shell", [["/bin/sh"], ["bash", "--posix"], ["bash"]], ids=["sh", "bash-posix", "bash"])
def test_the_state_reads_back_every_value_export_p_quotes(shell: list[str]) -> None:
    """The state is read from ``export -p`` (a builtin: no process per call): every quoting the
    shells use (dash's '…'"'"'…', bash's "…" with backslashes and $'…' with octal UTF-8 bytes)
    gives back the exact value, for values made of every character that quoting treats apart."""
    from smith_fast.mcp.shell_state import _exports

    pieces = ["a", "'", '"', "\\", "$", "`", "\n", "\t", " ", "é", "\x01", "\x7f", "=", "!", "*", "~", "中", "\r", "\x1b", "😀", "\\n"]
    rng = random.Random(31)
    for _ in range(60):
        env = {f"V{j}": "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for j in range(6)}
        out = subprocess.run([*shell, "-c", "export V_NOVALUE; export -p"], env=env, capture_output=True, check=True).stdout
        got = _exports(out.decode(errors="ignore"))
        assert {k: got.get(k) for k in env} == env
        assert "V_NOVALUE" not in got


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(alphabet=st.one_of(st.characters(), st.sampled_from("\x00\x01\x08\t\n\x0b\x0c\r\x1b\x1f\"\\\x7f\u2028\ud800\udfff")),
                        max_size=40), max_size=5))
def test_the_output_budget_counts_characters_as_a_json_string_shows_them(chunks: list[str]) -> None:
    # shown() (orjson) counts as json.dumps(ensure_ascii=False) does, lone surrogates too; the count
    # of a stream is the sum of its chunks' (what the budget's check at the end relies on)
    from smith_fast.mcp.results import shown

    for chunk in chunks:
        assert shown(chunk) == len(json.dumps(chunk, ensure_ascii=False)) - 2
    assert sum(map(shown, chunks)) == shown("".join(chunks))
