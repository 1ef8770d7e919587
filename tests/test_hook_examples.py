"""HOOKS.md's JavaScript examples, extracted from the document itself (so the two cannot drift), run
as written: loaded in-process and as a service's global hook, with output large enough to have hit
the quickjs-ng rope-string bug (a decision over ~1 KB from a hook that had called ``console.*`` came
back as ``TypeError: Unknown quickjs tag: -6`` and the command's output was lost)."""

from __future__ import annotations

import asyncio
import pathlib
import re

import pytest

from smith_fast.hooks.js import load_js
from smith_fast.pb import smith_pb2 as pb

from .peers import V1Peer, errors, terminal
from .server import ServerProcess, assert_clean_log

HOOKS_MD = pathlib.Path(__file__).resolve().parent.parent / "HOOKS.md"
AWS_KEY = "AKIAABCDEFGHIJKLMNOP"


def js_examples() -> dict[str, str]:
    """Every ```js block of HOOKS.md, by the file name its first line comment gives (``// policy.js``)."""
    blocks = re.findall(r"^```js\n(.*?)^```$", HOOKS_MD.read_text(), flags=re.S | re.M)
    named: dict[str, str] = {}
    for block in blocks:
        first = block.splitlines()[0]
        name = first[3:].strip() if first.startswith("// ") and first.endswith(".js") else f"example-{len(named)}"
        named[name] = block
    return named


def forty_lines() -> str:
    return "".join(f"line {i:02d}: export AWS_ACCESS_KEY_ID={AWS_KEY} # keep it secret\n" for i in range(40))


def test_hooks_md_has_the_policy_example() -> None:
    assert "policy.js" in js_examples()


@pytest.mark.parametrize("name", sorted(js_examples()))
def test_every_js_example_loads(name: str) -> None:
    hook = load_js(js_examples()[name])
    assert hook.triggers


def test_policy_example_redacts_forty_lines_with_console_output() -> None:
    hook = load_js(js_examples()["policy.js"])
    text = forty_lines()
    decision = asyncio.run(hook.call("on_shell_output", {"stream": "stdout", "text": text}))
    assert decision.action == "transform"
    assert decision.data == {"stream": "stdout", "text": text.replace(AWS_KEY, "[aws key]")}
    assert len(decision.data["text"]) > 1024  # the size at which the bindings used to fail


@pytest.mark.parametrize("size", [10, 600, 1100, 5000, 200_000])
def test_long_answers_with_console_output_come_back(size: int) -> None:
    hook = load_js(
        "function onShellOutput(p) { console.log('x'.repeat(50) + p.stream);"
        " return {action: 'transform', data: {stream: p.stream, text: 'r'.repeat(p.text.length) + '!'}}; }"
    )
    decision = asyncio.run(hook.call("on_shell_output", {"stream": "stdout", "text": "t" * size}))
    assert (decision.action, decision.data) == ("transform", {"stream": "stdout", "text": "r" * size + "!"})


def test_policy_example_as_a_global_hook_keeps_the_output(tmp_path: pathlib.Path) -> None:
    (tmp_path / "policy.js").write_text(js_examples()["policy.js"])
    (tmp_path / "keys.txt").write_text(forty_lines())
    srv = ServerProcess(tmp_path, "--hook", str(tmp_path / "policy.js")).start()
    try:
        peer = V1Peer(srv.unix)
        peer.handshake(caps=(pb.CAPABILITY_SHELL_EXEC,))
        peer.command(shell_exec=pb.ShellExecCommand(request_id="k", command=f"cat {tmp_path / 'keys.txt'}"))
        envs = peer.until(terminal("k"))
        assert not errors(envs)
        out = "".join(e.event.shell_output.stdout for e in envs if e.HasField("event") and e.event.HasField("shell_output"))
        assert out == forty_lines().replace(AWS_KEY, "[aws key]")
        exits = [e.event.shell_output.exit_code for e in envs if e.HasField("event") and e.event.shell_output.HasField("exit_code")]
        assert exits == [0]
        peer.close()
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)
    assert any(r.get("event") == "hook console" and "redacted an AWS key" in str(r.get("text")) for r in srv.logs)
