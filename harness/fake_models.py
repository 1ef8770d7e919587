"""Fake model APIs for driving real coding-agent CLIs offline: the Anthropic Messages API (Claude
Code) and the OpenAI Responses API (Codex), both streaming with SSE, on one local HTTP server.

A test registers a :class:`Script` (a list of tool calls, then a final text) under a key and puts
``[script:KEY]`` in its prompt. Each model request that carries the marker and offers tools is
answered with the script's next step: which step is next is the number of tool results already in
the conversation, so a CLI's retries or side requests do not shift it. The tool results the CLI
sends back are recorded on the script as :class:`ToolResult` values (what the model would read):
that is what the tests assert on. Requests without the marker (titles, summaries, quota probes)
get a one-word text answer, and every request is kept in :attr:`FakeModels.requests` for a
failing test's message.

A step names a tool as the frontend's own name (``Bash``) or as an MCP tool's name on our server
(``shell``, ``fs.read``): the CLIs list MCP tools as ``mcp__SERVER__TOOL`` with characters outside
``[A-Za-z0-9_-]`` replaced, so the step is matched against the tools the request offers, by
suffix, and an unknown tool is answered with a text saying so (the test then fails on the
missing result, with the offered names in :attr:`Script.errors`).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeModels", "Script", "Step", "ToolResult"]

_MARKER = re.compile(r"\[script:([A-Za-z0-9_-]+)\]")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Step:
    """One tool call the fake model makes: ``tool`` is matched as described in the module doc."""

    tool: str
    arguments: dict[str, Any]
    label: str = ""


@dataclass
class ToolResult:
    """A tool result as the frontend sent it back to the model.

    ``raw`` is the wire value (Anthropic: the ``tool_result`` block; OpenAI: the
    ``function_call_output`` item), ``text`` its text parts joined, ``is_error`` the Anthropic
    block's ``is_error`` (None when the API has no such flag: the Responses API).
    """

    step: Step
    tool_name: str
    raw: Any
    text: str
    is_error: bool | None
    seconds: float  # from the model's call to the request that carried the result


@dataclass
class Script:
    steps: list[Step]
    final: str = "done"
    results: dict[int, ToolResult] = field(default_factory=dict)
    issued: dict[int, float] = field(default_factory=dict)  # step -> time.monotonic() of its call
    errors: list[str] = field(default_factory=list)
    finished: bool = False

    def result(self, label: str) -> ToolResult:
        """The recorded result of the step labelled ``label``."""
        for i, step in enumerate(self.steps):
            if step.label == label:
                if i not in self.results:
                    raise AssertionError(f"no result recorded for step {label!r}; recorded {sorted(self.results)}, errors {self.errors}")
                return self.results[i]
        raise KeyError(label)


def _text_of(content: Any) -> str:
    """The text a tool result shows the model: strings as they are, text parts of lists joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(part.get("text") if isinstance(part, dict) else part) for part in content)
    return json.dumps(content)


def _tool_names(tools: Any, namespace: str | None = None) -> list[tuple[str | None, str]]:
    """Every (namespace, name) the request's tool list offers. Codex lists an MCP server's tools
    in a ``namespace`` entry (``mcp__smith``) and expects calls to name both."""
    names: list[tuple[str | None, str]] = []
    if isinstance(tools, list):
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            if tool.get("type") == "namespace":
                names.extend(_tool_names(tool.get("tools"), tool["name"]))
            else:
                names.append((namespace, tool["name"]))
    return names


def _qualified(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{namespace}__{name}"


def _resolve(tool: str, offered: list[tuple[str | None, str]]) -> tuple[str | None, str] | None:
    exact = [entry for entry in offered if entry == (None, tool)]
    if exact:
        return exact[0]
    suffix = "__" + _UNSAFE.sub("_", tool)
    matches = [entry for entry in offered if _qualified(*entry).endswith(suffix)]
    return matches[0] if len(matches) == 1 else None


class FakeModels:
    """``with FakeModels() as fake:`` serves ``fake.anthropic_url`` and ``fake.openai_url``."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        models = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with models._lock:
                    models.requests.append(("GET", self.path, None))
                if self.path.split("?")[0].endswith("/models"):
                    self._json(200, {"object": "list", "data": [], "models": []})
                else:
                    self._json(404, {"error": {"type": "not_found_error", "message": f"no {self.path} here"}})

            def do_HEAD(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"unparsed": raw.decode(errors="replace")}
                path = self.path.split("?")[0]
                with models._lock:
                    models.requests.append(("POST", self.path, body))
                if path.endswith("/messages/count_tokens"):
                    self._json(200, {"input_tokens": 100})
                elif path.endswith("/messages"):
                    models._anthropic(self, body)
                elif path.endswith("/responses"):
                    models._openai(self, body)
                else:
                    self._json(404, {"error": {"type": "not_found_error", "message": f"no {path} here"}})

            def _json(self, status: int, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
                data = b"".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode() for name, payload in events)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # the test's output stays its own

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.anthropic_url = base  # ANTHROPIC_BASE_URL: the client appends /v1/messages
        self.openai_url = base + "/v1"  # a Responses provider's base_url: the client appends /responses
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-models", daemon=True)

    def __enter__(self) -> FakeModels:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def script(self, key: str, steps: list[Step], final: str = "done") -> Script:
        script = Script(steps, final)
        with self._lock:
            self.scripts[key] = script
        return script

    # ---- the script's turn -------------------------------------------------------------------

    def _next(
        self, body: Any, results: list[tuple[str, Any, str, bool | None]]
    ) -> tuple[Script | None, Step | None, tuple[str | None, str] | None]:
        """The script this request belongs to, recording ``results`` (call id, raw, text, is_error),
        and the step to answer with (None: the final text) with its tool name as offered."""
        found = _MARKER.search(json.dumps(body.get("messages", body.get("input", ""))))
        offered = _tool_names(body.get("tools"))
        if found is None or not offered:
            return None, None, None
        with self._lock:
            script = self.scripts.get(found.group(1))
            if script is None:
                return None, None, None
            for i, (_call, raw, text, is_error) in enumerate(results):
                if i < len(script.steps) and i not in script.results:
                    step = script.steps[i]
                    resolved = _resolve(step.tool, offered)
                    seconds = time.monotonic() - script.issued.get(i, time.monotonic())
                    script.results[i] = ToolResult(step, step.tool if resolved is None else _qualified(*resolved), raw, text, is_error, seconds)
            index = len(results)
            if index >= len(script.steps):
                script.finished = True
                return script, None, None
            step = script.steps[index]
            script.issued.setdefault(index, time.monotonic())
            name = _resolve(step.tool, offered)
            if name is None:
                listed = [_qualified(*entry) for entry in offered]
                script.errors.append(f"step {index} ({step.label}): no tool {step.tool!r} among {listed}")
            return script, step, name

    def _call_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    # ---- Anthropic Messages ------------------------------------------------------------------

    def _anthropic(self, handler: Any, body: Any) -> None:
        results: list[tuple[str, Any, str, bool | None]] = []
        for message in body.get("messages", []):
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "tool_result":
                        results.append((part.get("tool_use_id", ""), part, _text_of(part.get("content")), bool(part.get("is_error", False))))
        script, step, name = self._next(body, results)
        msg_id = self._call_id("msg_")
        if step is not None and name is not None:
            block: dict[str, Any] = {"type": "tool_use", "id": self._call_id("toolu_"), "name": _qualified(*name), "input": step.arguments}
            stop = "tool_use"
        else:
            text = "ok" if script is None else (script.final if step is None else f"cannot: {script.errors[-1]}")
            block = {"type": "text", "text": text}
            stop = "end_turn"
        model = body.get("model", "claude-fake")
        usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if not body.get("stream"):
            handler._json(200, {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [block],
                                "stop_reason": stop, "stop_sequence": None, "usage": usage})
            return
        start = dict(block)
        if block["type"] == "tool_use":
            start["input"] = {}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start["text"] = ""
            delta = {"type": "text_delta", "text": block["text"]}
        handler.sse([
            ("message_start", {"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"}),
        ])

    # ---- OpenAI Responses --------------------------------------------------------------------

    def _openai(self, handler: Any, body: Any) -> None:
        results: list[tuple[str, Any, str, bool | None]] = []
        for entry in body.get("input", []):
            if isinstance(entry, dict) and entry.get("type") in ("function_call_output", "custom_tool_call_output"):
                results.append((entry.get("call_id", ""), entry, _text_of(entry.get("output")), None))
        script, step, name = self._next(body, results)
        resp_id = self._call_id("resp_")
        if step is not None and name is not None:
            item: dict[str, Any] = {"type": "function_call", "id": self._call_id("fc_"), "call_id": self._call_id("call_"),
                                    "name": name[1], "arguments": json.dumps(step.arguments), "status": "completed"}
            if name[0] is not None:
                item["namespace"] = name[0]
            events: list[tuple[str, dict[str, Any]]] = [
                ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": {**item, "arguments": "", "status": "in_progress"}}),
                ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta", "output_index": 0,
                                                            "item_id": item["id"], "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {"type": "response.function_call_arguments.done", "output_index": 0,
                                                           "item_id": item["id"], "arguments": item["arguments"]}),
            ]
        else:
            text = "ok" if script is None else (script.final if step is None else f"cannot: {script.errors[-1]}")
            item = {"type": "message", "id": self._call_id("msg_"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
            events = [
                ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": [], "status": "in_progress"}}),
                ("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
                                                "item_id": item["id"], "delta": text}),
            ]
        usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
        response = {"id": resp_id, "object": "response", "status": "in_progress", "model": body.get("model", "gpt-fake"), "output": []}
        handler.sse([
            ("response.created", {"type": "response.created", "response": response}),
            *events,
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {**response, "status": "completed", "output": [item], "usage": usage}}),
        ])
