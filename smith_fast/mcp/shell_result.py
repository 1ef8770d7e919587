"""The ``CallToolResult`` of a ``shell`` call: every fact in ``structuredContent`` (what Claude Code
and Codex show the model) and in the text, ``isError`` when the command did not succeed.

Not succeeding, as the frontends' own shells count it: a non-zero exit, a timeout, a kill (a
signal, a ``--max-*-per-command`` limit, a cancel), a refusal (a hook, the env policy, the sandbox's
``cwd`` rule, no process slot: the command never ran). Each says why in its own field.
"""

from __future__ import annotations

import signal
from typing import Any

from ..pb import smith_pb2 as pb
from .shell_state import ShellState
from .sink import Call

__all__ = ["shell_result"]

_MAX_OUTPUT_NOTICE = "(--max-output)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def shell_result(
    call: Call,
    stdout: str,
    stderr: str,
    out_cut: dict[str, object] | None,
    err_cut: dict[str, object] | None,
    state: ShellState,
    state_saved: bool,
    dropped: list[str],
) -> dict[str, Any]:
    shell = call.shell_call
    assert shell is not None
    code = call.exit_code
    reasons = [details.get("reason", "") for _, details in call.failures]
    timed_out = any(c == pb.ERROR_CODE_EXECUTION_TIMEOUT for c, _ in call.failures)
    signal_number = -code if code is not None and code < 0 else None
    kill_reason: str | None = None
    if timed_out:
        kill_reason = f"timeout after {shell.timeout_s:g} s"
    elif "limit" in reasons:
        limit = next(d.get("limit", "") for _, d in call.failures if d.get("reason") == "limit")
        kill_reason = f"limit {limit}".strip()
    elif "cancelled" in reasons:
        kill_reason = "cancelled"
    elif signal_number is not None:
        kill_reason = _signal_name(signal_number)
    killed = kill_reason is not None and code is not None
    refused = code is None and bool(call.failures or call.errors)
    refusal: str | None = None
    if refused:
        first_code, details = call.failures[0] if call.failures else (pb.ERROR_CODE_UNSPECIFIED, {})
        refusal = details.get("reason") or pb.ErrorCode.Name(first_code).removeprefix("ERROR_CODE_").lower()
    capped = _MAX_OUTPUT_NOTICE in stderr
    files = {"stdout": out_cut["file"] if out_cut else None, "stderr": err_cut["file"] if err_cut else None}
    structured: dict[str, Any] = {
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": code,
        "stdout_bytes": call.out_bytes,
        "stderr_bytes": call.err_bytes,
        "truncated": out_cut is not None or err_cut is not None or capped,
        "cut": {"stdout": out_cut, "stderr": err_cut},
        "output_file": files["stdout"] or files["stderr"],
        "output_capped": capped,
        "timed_out": timed_out,
        "timeout_s": shell.timeout_s,
        "timeout_capped": shell.capped_timeout,
        "killed": killed,
        "signal": signal_number,
        "kill_reason": kill_reason,
        "refused": refused,
        "refusal": refusal,
        "errors": list(call.errors),
        "cwd": state.cwd,
        "state_saved": state_saved,
        "env_not_kept": dropped,
        "egress_refused": list(call.refused_connections),
    }
    is_error = code != 0 or bool(call.errors)
    text = [stdout]
    if stderr:
        text.append(("\n" if stdout and not stdout.endswith("\n") else "") + "[stderr]\n" + stderr)
    for error in call.errors:
        text.append(f"\n[error] {error}")
    if refused:
        text.append(f"\n[refused ({refusal}): the command did not run]")
    if timed_out:
        text.append(f"\n[timed out after {shell.timeout_s:g} s: its process group was terminated]")
    if killed and not timed_out:
        text.append(f"\n[killed: {kill_reason}]")
    if shell.capped_timeout:
        text.append(f"\n[the timeout asked for is over --mcp-max-timeout: {shell.timeout_s:g} s was used]")
    for stream, cut in (("stdout", out_cut), ("stderr", err_cut)):
        if cut is not None:
            text.append(
                f"\n[{stream} cut: {cut['head_lines']} first and {cut['tail_lines']} last of {cut['total_lines']} lines shown; "
                f"the whole of it: {cut['file']}]"
            )
    for connection in call.refused_connections:
        text.append(f"\n[network: {connection['message']} (rule {connection['rule']})]")
    if dropped:
        text.append(f"\n[not kept for the next call (env policy): {', '.join(dropped)}]")
    if not state_saved and not refused:
        text.append("\n[the working directory and variables stay as they were before this call]")
    if code is not None:
        text.append(f"\n[exit code {code}]")
    elif not refused:
        text.append("\n[the command did not run]")
    text.append(f"\n[cwd: {state.cwd or 'the root'}]")
    return {"content": [{"type": "text", "text": "".join(text)}], "structuredContent": structured, "isError": is_error}
