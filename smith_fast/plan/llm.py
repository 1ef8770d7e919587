"""The model planner: asks an OpenAI-compatible chat-completions endpoint for the plan as JSON.

One ``POST {base}/chat/completions`` per plan (OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM,
LM Studio ... all speak it). The answer's ``choices[0].message.content`` must be the JSON form of a
plan (:mod:`~smith_fast.plan.schema`), optionally inside a Markdown code fence; it is checked like
any other plan, so a cycle, an unknown dependency or malformed JSON is a :class:`PlanError` that says
which. The reply's ``usage`` becomes :attr:`Plan.usage` (and a ``TokenUsageEvent``).
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..pb import smith_pb2
from .http import HttpError, HttpResponse, post
from .model import Plan, PlanError, Usage
from .options import KNOWN_KEYS, PlanOptions
from .rules import steps_plan
from .schema import DEFAULT_MAX_STEPS, build_plan, decode_plan_json

__all__ = ["SYSTEM_PROMPT", "HttpPost", "LlmPlanner", "chat_completions_url"]

SYSTEM_PROMPT = """\
You turn a software task into a plan: a few steps forming a directed acyclic graph.
Answer with one JSON object and nothing else, shaped like this:
{"steps": [
  {"id": "build", "label": "Build the project", "kind": "shell", "command": "make", "depends_on": []},
  {"id": "test", "label": "Run the tests", "kind": "shell", "command": "make test", "depends_on": ["build"]},
  {"id": "report", "label": "Read the report", "kind": "tool", "tool": "fs.read", "args": {"path": "report.txt"}, "depends_on": ["test"]},
  {"id": "review", "label": "Ask a human to review the diff", "kind": "note", "depends_on": ["test"]}
]}
Rules:
- "id": a short name, unique in the plan. "label": a few words saying what the step does.
- "kind" is "shell" (a POSIX sh command line in "command", run in the project directory),
  "tool" (a tool from the list below in "tool", its JSON arguments object in "args"),
  or "note" (something for a human to do; only a label).
- "depends_on": the ids of the steps that must succeed before this step starts. Use only ids from
  the plan and never make a cycle. Steps that do not depend on each other may run at the same time.
- Prefer few, concrete steps. Do not invent files or tools you were not told about."""

HttpPost = Callable[..., Awaitable[HttpResponse]]
"""``post(url, body, headers, *, timeout)``, as :func:`smith_fast.plan.http.post`."""

_FENCE = re.compile(r"```[\w+-]*[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)
_EXCERPT = 200


def chat_completions_url(url: str) -> str:
    """The chat-completions URL for a base URL (``http://host:8000/v1``) or a full one.

    Args:
        url: ``--planner-url``.

    Returns:
        ``url`` if it already ends in ``/chat/completions``, else ``url + "/chat/completions"``.

    Raises:
        PlanError: ``planner_config``: not an ``http://`` or ``https://`` URL.
    """
    text = url.strip()
    if not re.match(r"https?://[^/?#\s]+", text, re.IGNORECASE):
        raise PlanError(f"the planner URL {url!r} is not an http:// or https:// URL", "planner_config")
    text = text.rstrip("/")
    return text if text.endswith("/chat/completions") else text + "/chat/completions"


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            text = message
    except (ValueError, AttributeError):
        pass
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…"


def _strip_fence(content: str) -> str:
    """The plan inside a Markdown code fence, when the model wrapped it in one (with or without
    prose around it) instead of answering bare JSON."""
    if content.lstrip()[:1] in ("{", "["):
        return content
    match = _FENCE.search(content)
    return match[1] if match else content


class LlmPlanner:
    """Plans with a model behind an OpenAI-compatible chat-completions endpoint.

    ``context["steps"]``, when given, is used as the plan and the model is not asked.

    Args:
        url: the endpoint's base URL (``https://api.openai.com/v1``) or its full
            ``/chat/completions`` URL.
        model: the model name sent in the request.
        api_key: sent as ``Authorization: Bearer <api_key>``; ``None`` sends no ``Authorization``
            (local servers need none).
        timeout: seconds for the whole HTTP exchange.
        tools: tool name → one-line description; listed in the prompt, and tool steps must name one.
        json_mode: send ``response_format: {"type": "json_object"}`` (turn off for a server that
            rejects it).
        temperature: sampling temperature; 0 for the most repeatable plans.
        max_steps: the most steps a plan may have.
        http: the function that POSTs; :func:`smith_fast.plan.http.post` by default.
        ssl_context: for ``https`` endpoints; ``None`` means the system's trust store.

    Raises:
        PlanError: ``planner_config`` for a bad URL, an empty model name or an API key with a line break.
    """

    name = "llm"

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        tools: Mapping[str, str] | None = None,
        json_mode: bool = True,
        temperature: float = 0.0,
        max_steps: int = DEFAULT_MAX_STEPS,
        http: HttpPost | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoint = chat_completions_url(url)
        if not model or not model.strip():
            raise PlanError("the llm planner needs a model name (--planner-model)", "planner_config")
        if api_key is not None and any(c in api_key for c in "\r\n\0"):
            raise PlanError("the planner API key holds a line break or NUL", "planner_config")
        self.model = model.strip()
        self.api_key = api_key.strip() if api_key and api_key.strip() else None
        self.timeout = timeout
        self.tools = dict(tools) if tools is not None else None
        self.json_mode = json_mode
        self.temperature = temperature
        self.max_steps = max_steps
        self._http = http or post
        self._ssl_context = ssl_context

    def __repr__(self) -> str:  # never shows the key
        return f"LlmPlanner({self.endpoint!r}, model={self.model!r})"

    # ---- the request ---------------------------------------------------------------------------

    def system_prompt(self) -> str:
        """The system message: the plan format, plus the tools when known."""
        if not self.tools:
            return SYSTEM_PROMPT + "\nNo tools are available: use shell and note steps only."
        listing = "\n".join(f"- {name}: {desc}" if desc else f"- {name}" for name, desc in sorted(self.tools.items()))
        return f"{SYSTEM_PROMPT}\nTools:\n{listing}"

    def request_body(self, goal: str, context: Mapping[str, str]) -> dict[str, Any]:
        """The chat-completions request for a goal.

        Args:
            goal: the goal.
            context: the command's context; keys smith-fast does not consume are shown to the model.

        Returns:
            The JSON request body as a dict.
        """
        user = f"Goal:\n{goal.strip()}"
        extra = {k: v for k, v in sorted(context.items()) if k not in KNOWN_KEYS}
        if extra:
            user += "\n\nContext:\n" + json.dumps(extra, indent=1, ensure_ascii=False)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": user}],
            "temperature": self.temperature,
            "stream": False,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def _headers(self, options: PlanOptions) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if options.traceparent:
            headers["traceparent"] = options.traceparent
        return headers

    # ---- planning ------------------------------------------------------------------------------

    async def plan(self, goal: str, context: Mapping[str, str]) -> Plan:
        """Ask the model for a plan and check it.

        Args:
            goal: ``PlanCommand.goal``.
            context: ``PlanCommand.context``.

        Returns:
            The plan, with the model's usage.

        Raises:
            PlanError: a bad context value; the endpoint is unreachable (``planner_unavailable``),
                answers a non-200 status (``planner_http``, with its error message), something that
                is not a chat completion (``planner_reply``) or nothing in time (``planner_timeout``,
                ``ERROR_CODE_EXECUTION_TIMEOUT``); or the model's plan is not JSON or breaks a rule.
                When the model answered, the error's ``usage`` attribute holds its usage.
        """
        options = PlanOptions.from_context(context)
        tools = None if self.tools is None else self.tools.keys()
        if options.steps is not None:
            return steps_plan(goal, options, planner=self.name, known_tools=tools, max_steps=self.max_steps)
        if not goal.strip():
            raise PlanError('the goal is empty and the context has no "steps"')
        body = json.dumps(self.request_body(goal, context), ensure_ascii=False).encode()
        post_kwargs: dict[str, Any] = {"timeout": self.timeout}
        if self._ssl_context is not None:
            post_kwargs["ssl_context"] = self._ssl_context
        try:
            response = await self._http(self.endpoint, body, self._headers(options), **post_kwargs)
        except TimeoutError:
            raise PlanError(
                f"the planner endpoint {self.endpoint} did not answer within {self.timeout:g} s",
                "planner_timeout",
                code=smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT,
            ) from None
        except HttpError as exc:
            reason = "planner_unavailable" if exc.connect else "planner_reply"
            raise PlanError(f"the planner endpoint {self.endpoint}: {exc}", reason) from None
        if response.status != 200:
            raise PlanError(
                f"the planner endpoint {self.endpoint} answered HTTP {response.status}"
                f"{' ' + response.reason if response.reason else ''}: {_excerpt(response.body) or '(empty body)'}",
                "planner_http",
                details={"http_status": str(response.status)},
            )
        content, finish_reason, usage, model = self._completion(response.body, options)
        metadata = {"planner": self.name, "model": model}
        if options.traceparent:
            metadata["traceparent"] = options.traceparent
        source = "the model's plan"
        try:
            try:
                value = decode_plan_json(_strip_fence(content), source)
            except PlanError as exc:
                if finish_reason == "length":
                    exc.args = (f"{exc.args[0]} (the reply was cut off: finish_reason is \"length\")",)
                raise
            return build_plan(
                value,
                goal,
                source=source,
                known_tools=tools,
                max_steps=self.max_steps,
                usage=usage,
                metadata=metadata,
            )
        except PlanError as exc:
            exc.usage = usage
            raise

    def _completion(self, raw: bytes, options: PlanOptions) -> tuple[str, str | None, Usage | None, str]:
        """Pull content, finish reason, usage and model out of a chat-completion body."""
        where = f"the planner endpoint {self.endpoint}"
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):
            raise PlanError(f"{where} answered a body that is not JSON: {_excerpt(raw)!r}", "planner_reply") from None
        choices = reply.get("choices") if isinstance(reply, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        message = choice.get("message") if choice else None
        if not isinstance(message, dict):
            raise PlanError(f"{where} answered JSON that is not a chat completion (no choices[0].message)", "planner_reply")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                raise PlanError(f"the model refused to plan: {refusal}", "planner_reply")
            raise PlanError(f"{where} answered a chat completion without text in choices[0].message.content", "planner_reply")
        served = reply.get("model")
        model = served if isinstance(served, str) and served else self.model
        usage = None
        raw_usage = reply.get("usage")
        if isinstance(raw_usage, dict):
            total = _count(raw_usage.get("total_tokens"))
            if total is None:
                total = (_count(raw_usage.get("prompt_tokens")) or 0) + (_count(raw_usage.get("completion_tokens")) or 0)
            remaining = None if options.token_budget is None else max(0, options.token_budget - total)
            usage = Usage(total, remaining, model)
        finish = choice.get("finish_reason") if choice else None
        return content, finish if isinstance(finish, str) else None, usage, model


def _count(value: Any) -> int | None:
    """A token count from the reply, or ``None`` when it is not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
