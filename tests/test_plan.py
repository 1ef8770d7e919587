"""Plans: shell-goal splitting, the rules and llm planners, graph deltas, and plan execution.

Everything runs for real: the llm planner talks HTTP to a stdlib ``http.server`` speaking the
chat-completions API in a thread, shell steps run as child processes (``run_collect``), tool steps
through the built-in tool registry on a temporary workspace.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import pickle
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast.errors import ProtocolError
from smith_fast.jsonl import JsonlCodec
from smith_fast.pb import smith_pb2
from smith_fast.plan import (
    AFTER,
    DEPENDS_ON,
    LlmPlanner,
    Plan,
    PlanError,
    PlanExecutor,
    PlanOptions,
    Planner,
    RulesPlanner,
    Step,
    Usage,
    chat_completions_url,
    plan_deltas,
    planner_from_options,
    run_plan_command,
    split_shell_goal,
    token_usage_event,
)
from smith_fast.plan.http import HttpError, post
from smith_fast.process import run_collect
from smith_fast.tools import ToolContext, default_registry

pytestmark = pytest.mark.timeout(60)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


# --- helpers ---------------------------------------------------------------------------------

def on_both_loops(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test through the ``run`` fixture (tests/conftest.py): on stdlib asyncio and on
    uvloop (ids ``[asyncio]``/``[uvloop]``), each on a fresh loop whose exception handler must not fire."""

    def wrapper(run: Callable[[Coroutine[Any, Any, None]], None], **kwargs: Any) -> None:
        run(test(**kwargs))

    signature = inspect.signature(test)
    run_param = inspect.Parameter("run", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    wrapper.__signature__ = signature.replace(parameters=[run_param, *signature.parameters.values()])  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapper, attr, getattr(test, attr))
    wrapper.pytestmark = list(getattr(test, "pytestmark", []))  # type: ignore[attr-defined]
    return wrapper


def is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


class Graph:
    """A client's view of the graph, built by applying deltas (removals first, then additions)."""

    def __init__(self) -> None:
        self.nodes: dict[str, smith_pb2.GraphNode] = {}
        self.edges: dict[str, smith_pb2.GraphEdge] = {}
        self.history: dict[str, list[str]] = {}  # node id -> statuses in order

    def apply(self, delta: smith_pb2.GraphDeltaEvent) -> None:
        for node_id in delta.nodes_removed:
            assert node_id in self.nodes, f"removal of unknown node {node_id}"
            del self.nodes[node_id]
        for edge_id in delta.edges_removed:
            del self.edges[edge_id]
        for node in delta.nodes_added:
            assert node.id not in self.nodes, f"node {node.id} added twice"
            self.nodes[node.id] = node
            self.history.setdefault(node.id, []).append(node.metadata["status"])
        for edge in delta.edges_added:
            src, dst = getattr(edge, "from"), edge.to
            assert src in self.nodes and dst in self.nodes, "edge to a node not drawn yet"
            assert edge.id not in self.edges
            self.edges[edge.id] = edge

    def status(self, node_id: str) -> str:
        return str(self.nodes[node_id].metadata["status"])

    def edge_set(self) -> set[tuple[str, str, str]]:
        return {(getattr(e, "from"), e.to, e.edge_type) for e in self.edges.values()}


def by_ref(plan: Plan) -> dict[str, Step]:
    return {step.ref: step for step in plan.steps}


def rules(goal: str, **context: str) -> Plan:
    return RulesPlanner().plan_now(goal, context)


def steps_context(steps: Any, **extra: str) -> dict[str, str]:
    return {"steps": json.dumps(steps), **extra}


# --- splitting a shell goal --------------------------------------------------------------------


@pytest.mark.parametrize(
    "goal, expected",
    [
        ("make", [("make", "")]),
        ("make && make test", [("make", ""), ("make test", "&&")]),
        ("a; b\nc", [("a", ""), ("b", ";"), ("c", ";")]),
        ("a && b; c && d", [("a", ""), ("b", "&&"), ("c", ";"), ("d", "&&")]),
        ("echo 'a && b' && echo \"c; d\"", [("echo 'a && b'", ""), ('echo "c; d"', "&&")]),
        ("echo a\\;b && echo \\&\\&", [("echo a\\;b", ""), ("echo \\&\\&", "&&")]),
        # '||' binds the whole and-or list: cutting it would change what runs when 'a' fails.
        ("a && b || c; d", [("a && b || c", ""), ("d", ";")]),
        ("a | grep x && b", [("a | grep x", ""), ("b", "&&")]),
        ("sleep 1 & echo x", [("sleep 1 & echo x", "")]),
        ("a 2>&1 && b &>/dev/null", [("a 2>&1", ""), ("b &>/dev/null", "&&")]),
        ("if true; then echo a; fi && echo b", [("if true; then echo a; fi", ""), ("echo b", "&&")]),
        ("for x in 1 2; do echo $x; done; echo end", [("for x in 1 2; do echo $x; done", ""), ("echo end", ";")]),
        ("while false; do :; done\nuntil true; do :; done", [("while false; do :; done", ""), ("until true; do :; done", ";")]),
        ("case $x in a) echo;; b|c) echo b;; esac && z", [("case $x in a) echo;; b|c) echo b;; esac", ""), ("z", "&&")]),
        ("{ a; b; } && c", [("{ a; b; }", ""), ("c", "&&")]),
        ("f() { a; b; }; f", [("f() { a; b; }", ""), ("f", ";")]),
        ("[[ a && b ]] && c", [("[[ a && b ]]", ""), ("c", "&&")]),
        ("(cd x && make) && echo $(date; echo) && echo `a;b`", [("(cd x && make)", ""), ("echo $(date; echo)", "&&"), ("echo `a;b`", "&&")]),
        ("echo ${x:-a;b} ; echo $((1 + (2 && 3)))", [("echo ${x:-a;b}", ""), ("echo $((1 + (2 && 3)))", ";")]),
        ("echo \"$(echo ')'; echo \"x;y\")\" && z", [("echo \"$(echo ')'; echo \"x;y\")\"", ""), ("z", "&&")]),
        # Comments are dropped, blank lines ignored; a line may continue after && || |.
        ("# build\nmake  # all\n\n\nmake test # then test", [("make", ""), ("make test", ";")]),
        ("echo a#b; echo c # d ; e", [("echo a#b", ""), ("echo c", ";")]),
        ("a &&\n  # why\n  b", [("a", ""), ("b", "&&")]),
        ("a |\n b && c", [("a |\n b", ""), ("c", "&&")]),
        ("ec\\\nho a \\\n && b", [("echo a", ""), ("b", "&&")]),
        # A here-document keeps its whole list in one step: its body follows the whole line.
        ("cat <<EOF && echo done\nhe said; don't\nEOF\necho next",
         [("cat <<EOF && echo done\nhe said; don't\nEOF", ""), ("echo next", ";")]),
        ("cat <<-'E F'\n\tx && y\n\tE F\nz", [("cat <<-'E F'\n\tx && y\n\tE F", ""), ("z", ";")]),
        ("cat <<EOF; echo x\nbody\nEOF\necho y", [("cat <<EOF; echo x\nbody\nEOF", ""), ("echo y", ";")]),
        ("cat <<< 'x;y' && z", [("cat <<< 'x;y'", ""), ("z", "&&")]),
        ("x=1 && echo if fi done", [("x=1", ""), ("echo if fi done", "&&")]),
        ("", []),
        ("  \n# nothing\n\n", []),
    ],
)
def test_split_shell_goal(goal: str, expected: list[tuple[str, str]]) -> None:
    assert split_shell_goal(goal) == expected


# Commands that hold separators sh does not split on, and the spellings of each separator.
SNIPPETS = [
    "echo a",
    "echo 'x && y; z'",
    'echo "a;b" "$(printf \'%s\' "c;d")"',
    "echo $(true; echo x) `echo y; echo z`",
    "if true; then echo t; else echo f; fi",
    "for i in 1 2; do echo $i; done",
    "while false; do :; done",
    "{ echo a; echo b; }",
    "(cd / && pwd)",
    "echo a\\;b \\&\\&",
    "printf '%s\\n' x | tr x y",
    "case a in a) echo a;; *) echo b;; esac",
    "[[ -n x && -z '' ]]",
    "echo ${HOME:-a;b} $((1 && 2))",
    "x=1",
    "f() { echo f; }",
]
SEPARATORS = {"&&": [" && ", "&&", " &&\n  ", "&& # why\n"], ";": ["; ", ";", "\n", " ;\n\n", "\n# note; && x\n"]}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(SNIPPETS), st.sampled_from(sorted(SEPARATORS)), st.integers(0, 4)), min_size=1, max_size=6),
    st.sampled_from(["", "\n", "# start\n", "  \n\n"]),
    st.sampled_from(["", ";", "\n", " # end"]),
)
def test_split_shell_goal_generated(parts: list[tuple[str, str, int]], head: str, tail: str) -> None:
    goal = head
    expected = []
    for k, (snippet, joiner, spelling) in enumerate(parts):
        if k:
            choices = SEPARATORS[joiner]
            goal += choices[spelling % len(choices)]
        goal += snippet
        expected.append((snippet, joiner if k else ""))
    goal += tail
    assert split_shell_goal(goal) == expected


@pytest.mark.parametrize(
    "goal, message",
    [
        ("echo 'a", "unterminated single quote starting at offset 5"),
        ('echo "a', "unterminated double quote starting at offset 5"),
        ("echo `a", "unterminated backquote starting at offset 5"),
        ("echo $(a", "'$(' at offset 5 is never closed"),
        ("(a", "'(' at offset 0 is never closed"),
        ("a )", "')' at offset 2 has no matching '('"),
        ("a &&", "'&&' at offset 2 has no command after it"),
        ("a && ; b", "'&&' at offset 2 has no command after it"),
        ("&& b", "'&&' at offset 0 has no command before it"),
        ("; a", "';' at offset 0 has no command before it"),
        ("a |", "'|' at offset 2 has no command after it"),
        ("a ;; b", "';;' at offset 2 is only valid inside case ... esac"),
        ("if a; then b", "'if' at offset 0 is never closed by 'fi'"),
        ("fi", "'fi' at offset 0 closes nothing"),
        ("then x", "'then' at offset 0 is outside any compound command"),
        ("while a; do b; fi", "'fi' at offset 15 cannot close 'while' at offset 0 (expected 'done')"),
        ("cat <<EOF\nx", "here-document at offset 4 is never closed by a line 'EOF'"),
        ("cat <<EOF", "here-document at offset 4 has no body"),
        ("cat << ;", "here-document at offset 4 has no delimiter word"),
    ],
)
def test_split_shell_goal_errors(goal: str, message: str) -> None:
    with pytest.raises(PlanError) as info:
        split_shell_goal(goal)
    assert str(info.value) == f"goal: {message}"
    assert info.value.reason == "invalid_goal"
    assert info.value.code == smith_pb2.ERROR_CODE_UNSPECIFIED


# --- the rules planner -------------------------------------------------------------------------


@on_both_loops
async def test_rules_planner_shell_goal() -> None:
    planner = RulesPlanner()
    assert isinstance(planner, Planner)
    plan = await planner.plan("make && make test; make clean\nls", {"traceparent": TRACEPARENT})
    a, b, c, d = plan.steps
    assert [s.command for s in plan.steps] == ["make", "make test", "make clean", "ls"]
    assert [s.kind for s in plan.steps] == ["shell"] * 4
    assert [s.ref for s in plan.steps] == ["1", "2", "3", "4"]
    assert (a.depends_on, a.after) == ((), ())
    assert (b.depends_on, b.after) == ((a.id,), ())
    assert (c.depends_on, c.after) == ((), (b.id,))
    assert (d.depends_on, d.after) == ((), (c.id,))
    assert all(is_uuid(s.id) for s in plan.steps) and is_uuid(plan.goal_id)
    assert len({s.id for s in plan.steps} | {plan.goal_id}) == 5
    assert plan.usage is None
    assert plan.metadata == {"planner": "rules", "traceparent": TRACEPARENT}
    assert plan.step(b.id) is b
    with pytest.raises(KeyError):
        plan.step(plan.goal_id)


def test_rules_planner_labels_and_note_goal() -> None:
    long = "echo " + "x" * 200
    plan = rules(f"{long}\nprintf 'a\nb'")
    assert plan.steps[0].label == long[:79] + "…"
    assert plan.steps[1].label == "printf 'a …"
    assert plan.steps[1].command == "printf 'a\nb'"
    note = rules("Fix the login bug\nand tell Ann", goal_kind="note")
    (step,) = note.steps
    assert (step.kind, step.label, step.command, step.ref) == ("note", "Fix the login bug …", None, "1")


@pytest.mark.parametrize(
    "goal, context, message, reason",
    [
        ("  ", {}, 'the goal is empty and the context has no "steps"', "invalid_plan"),
        ("# just a comment", {}, "the goal holds no shell command (only blank lines or comments)", "invalid_goal"),
        ("a", {"goal_kind": "prose"}, "context[\"goal_kind\"] must be shell or note, got 'prose'", "invalid_field"),
        ("a", {"execute": "maybe"}, "context[\"execute\"] must be true or false, got 'maybe'", "invalid_field"),
        ("a", {"max_parallel": "0"}, "context[\"max_parallel\"] must be an integer from 1 to 64, got '0'", "invalid_field"),
        ("a", {"max_parallel": "lots"}, "context[\"max_parallel\"] must be an integer from 1 to 64, got 'lots'", "invalid_field"),
        ("a", {"token_budget": "-1"}, "context[\"token_budget\"] must be an integer of at least 0, got '-1'", "invalid_field"),
        ("a", {"timeout_ms": "1.5"}, "context[\"timeout_ms\"] must be an integer of at least 1, got '1.5'", "invalid_field"),
    ],
)
def test_rules_planner_refuses(goal: str, context: dict[str, str], message: str, reason: str) -> None:
    with pytest.raises(PlanError) as info:
        RulesPlanner().plan_now(goal, context)
    assert str(info.value) == message
    assert info.value.reason == reason
    assert isinstance(info.value, ProtocolError)


def test_rules_planner_step_limit() -> None:
    with pytest.raises(PlanError) as info:
        RulesPlanner(max_steps=3).plan_now("a; b; c; d", {})
    assert str(info.value) == "the goal has 4 commands; the limit is 3"
    assert info.value.code == smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED
    assert info.value.reason == "too_many_steps"


def test_options_from_context() -> None:
    assert PlanOptions.from_context({}) == PlanOptions()
    options = PlanOptions.from_context(
        {"execute": "TRUE", "max_parallel": "8", "token_budget": "0", "timeout_ms": "1500", "goal_kind": "Note",
         "traceparent": TRACEPARENT.upper(), "steps": " [] ", "other": "x"}
    )
    assert options == PlanOptions(True, 8, 1500, 0, TRACEPARENT, "note", " [] ")
    for value in ("yes", "1", "on"):
        assert PlanOptions.from_context({"execute": value}).execute
    for value in ("no", "0", "off", "", "false"):
        assert not PlanOptions.from_context({"execute": value}).execute
    # A malformed traceparent is ignored, as W3C Trace Context asks of a receiver.
    for bad in ("garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "ff" + TRACEPARENT[2:], TRACEPARENT + "-x"):
        assert PlanOptions.from_context({"traceparent": bad}).traceparent is None
    future = "01" + TRACEPARENT[2:] + "-what-comes-next"
    assert PlanOptions.from_context({"traceparent": future}).traceparent == future


@on_both_loops
async def test_rules_planner_context_steps() -> None:
    steps = {
        "steps": [
            # Forward references are fine: the plan comes out in topological order.
            {"id": "test", "kind": "shell", "command": "make test", "depends_on": "build"},
            {"id": 1, "label": "  Build it ", "kind": "shell", "command": "make", "after": []},
            {"id": "build", "command": "make all", "depends_on": [1, 1], "after": [1]},
            {"id": "read", "tool": "fs.read", "args": {"path": "log"}, "after": ["test"]},
            {"kind": "note", "label": "Tell the team", "depends_on": ["test"], "unknown": "ignored"},
        ]
    }
    plan = await RulesPlanner(known_tools={"fs.read"}).plan("ship it", steps_context(steps))
    assert [s.ref for s in plan.steps] == ["1", "build", "test", "read", "5"]
    refs = by_ref(plan)
    one, build, test, read, note = plan.steps
    assert (one.label, one.command) == ("Build it", "make")
    assert build.kind == "shell" and build.label == "make all"
    # Depended on and waited "after" at once: the dependency wins; duplicates collapse.
    assert (build.depends_on, build.after) == ((one.id,), ())
    assert test.depends_on == (refs["build"].id,)
    assert (read.kind, read.tool, read.args, read.label, read.after) == ("tool", "fs.read", {"path": "log"}, "fs.read", (test.id,))
    assert read.args_json() == b'{"path":"log"}'
    assert (note.kind, note.label, note.depends_on) == ("note", "Tell the team", (test.id,))
    assert Step(id="x", label="t", kind="tool", tool="tools.list").args_json() == b"{}"
    # A bare list works too.
    assert len(rules("g", steps=json.dumps(steps["steps"][1:3])).steps) == 2


STEP_A = {"id": "a", "kind": "shell", "command": "true"}


@pytest.mark.parametrize(
    "steps, message, details",
    [
        ("{not json", 'context["steps"] is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2', {"reason": "invalid_json"}),
        ('"make"', 'context["steps"] must be a JSON object with a "steps" list, or a list of steps; got a string', {}),
        ({"plan": []}, 'context["steps"] is a JSON object without a "steps" list', {}),
        ({"steps": {"a": 1}}, 'context["steps"]: "steps" must be a list, got an object', {}),
        ([], 'context["steps"] has no steps', {}),
        ([STEP_A, "b"], 'context["steps"]: step 2 must be a JSON object, got a string', {"step": "2"}),
        ([{"id": "a", "kind": "Exec", "command": "x"}], 'context["steps"]: step 1 (id \'a\') "kind" must be one of shell, tool, note (\'exec\')', {"step": "a"}),
        ([{"id": "a"}], 'context["steps"]: step 1 (id \'a\') "kind" must be one of shell, tool, note (missing)', {"step": "a"}),
        ([{"id": "a", "kind": "shell"}], 'context["steps"]: step 1 (id \'a\') needs a non-empty "command" string (missing)', {"step": "a"}),
        ([{"id": "a", "kind": "shell", "command": "  "}], 'context["steps"]: step 1 (id \'a\') needs a non-empty "command" string (empty)', {"step": "a"}),
        ([{"id": "a", "kind": "shell", "command": ["ls"]}], 'context["steps"]: step 1 (id \'a\') needs a non-empty "command" string (a list)', {"step": "a"}),
        ([{"id": "a", "kind": "tool"}], 'context["steps"]: step 1 (id \'a\') needs a non-empty "tool" string (missing)', {"step": "a"}),
        ([{"id": "a", "kind": "note"}], 'context["steps"]: step 1 (id \'a\') needs a non-empty "label" string (missing)', {"step": "a"}),
        ([{"id": "a", "kind": "note", "label": 5}], 'context["steps"]: step 1 (id \'a\') "label" must be a string, got a number', {"step": "a"}),
        ([{"id": True, "command": "x"}], 'context["steps"]: step 1 (id \'True\') "id" must be a string or an integer, got a boolean', {"step": "True"}),
        ([STEP_A, {"id": "b", "command": "x", "depends_on": {"a": 1}}], 'context["steps"]: step 2 (id \'b\') "depends_on" must be a list of step ids, got an object', {"step": "b"}),
        ([STEP_A, {"id": "b", "command": "x", "depends_on": [None]}], 'context["steps"]: step 2 (id \'b\') an id in "depends_on" must be a string or an integer, got null', {"step": "b"}),
        ([STEP_A, {"id": "b", "command": "x", "depends_on": ["zz"]}], "context[\"steps\"]: step 2 (id 'b') depends on unknown step 'zz'", {"step": "b", "dependency": "zz"}),
        ([STEP_A, {"id": "b", "command": "x", "after": ["zz"]}], "context[\"steps\"]: step 2 (id 'b') after unknown step 'zz'", {"step": "b", "dependency": "zz"}),
        ([STEP_A, {"id": "b", "command": "x", "depends_on": ["b"]}], "context[\"steps\"]: step 2 (id 'b') depends on itself", {"step": "b", "cycle": "b"}),
        ([STEP_A, {"id": "a", "command": "x"}], "context[\"steps\"]: step 2 reuses id 'a' of step 1", {"step": "a"}),
        (
            [STEP_A, {"id": "b", "command": "x", "depends_on": ["d"]}, {"id": "c", "command": "x", "depends_on": ["b"]},
             {"id": "d", "command": "x", "after": ["c", "a"]}],
            "context[\"steps\"]: dependency cycle: step 'b' -> 'd' -> 'c' -> 'b' (each step waits for the next)",
            {"step": "b", "cycle": "b -> d -> c -> b"},
        ),
        ([{"id": "t", "tool": "fs.reed"}], "context[\"steps\"]: step 1 (id 't') uses unknown tool 'fs.reed' (known: fs.read, fs.write)", {"step": "t"}),
    ],
)
def test_context_steps_errors(steps: Any, message: str, details: dict[str, str]) -> None:
    text = steps if isinstance(steps, str) else json.dumps(steps)
    with pytest.raises(PlanError) as info:
        RulesPlanner(known_tools=["fs.read", "fs.write"]).plan_now("goal", {"steps": text})
    exc = info.value
    assert str(exc) == message
    assert exc.details == {"reason": "invalid_plan", **details}
    assert exc.code == smith_pb2.ERROR_CODE_UNSPECIFIED
    clone = pickle.loads(pickle.dumps(exc))
    assert (type(clone), str(clone), clone.details, clone.code) == (PlanError, message, exc.details, exc.code)


def test_context_steps_limit() -> None:
    steps = [{"command": "true"} for _ in range(5)]
    with pytest.raises(PlanError) as info:
        RulesPlanner(max_steps=4).plan_now("g", steps_context(steps))
    assert str(info.value) == 'context["steps"] has 5 steps; the limit is 4'
    assert info.value.code == smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED


# --- graph deltas ------------------------------------------------------------------------------


def test_plan_deltas_draw_the_plan_in_build_order() -> None:
    steps = [
        {"id": "build", "command": "make"},
        {"id": "test", "command": "make test", "depends_on": ["build"]},
        {"id": "lint", "command": "make lint", "depends_on": ["build"]},
        {"id": "read", "tool": "fs.read", "args": {"path": "x"}, "after": ["test"]},
        {"id": "done", "kind": "note", "label": "Done", "depends_on": ["lint", "test"]},
    ]
    plan = rules("ship\nit", steps=json.dumps(steps), traceparent=TRACEPARENT)
    rid = str(uuid.uuid4())
    deltas = plan_deltas(plan, rid)
    assert len(deltas) == len(steps) + 2
    assert all(d.request_id == rid for d in deltas)
    assert all(not d.nodes_removed and not d.edges_removed for d in deltas)
    graph = Graph()
    for delta in deltas:
        graph.apply(delta)  # asserts every edge joins nodes already drawn
    goal = deltas[0].nodes_added[0]
    assert (goal.id, goal.label, goal.node_type) == (plan.goal_id, "ship …", "goal")
    assert dict(goal.metadata) == {"status": "pending", "goal": "ship\nit", "steps": "5", "planner": "rules", "traceparent": TRACEPARENT}
    s = by_ref(plan)
    assert [d.nodes_added[0].id for d in deltas[1:-1]] == [step.id for step in plan.steps]
    assert dict(graph.nodes[s["build"].id].metadata) == {"status": "pending", "ref": "build", "index": "1", "command": "make"}
    assert dict(graph.nodes[s["read"].id].metadata) == {
        "status": "pending", "ref": "read", "index": "4", "tool": "fs.read", "args": '{"path":"x"}'
    }
    assert graph.nodes[s["done"].id].node_type == "note" and graph.nodes[s["read"].id].node_type == "tool"
    # from = the waiting node, to = the node it waits for; the goal waits for the final steps.
    assert graph.edge_set() == {
        (s["test"].id, s["build"].id, DEPENDS_ON),
        (s["lint"].id, s["build"].id, DEPENDS_ON),
        (s["read"].id, s["test"].id, AFTER),
        (s["done"].id, s["lint"].id, DEPENDS_ON),
        (s["done"].id, s["test"].id, DEPENDS_ON),
        (plan.goal_id, s["read"].id, DEPENDS_ON),
        (plan.goal_id, s["done"].id, DEPENDS_ON),
    }
    assert all(is_uuid(i) for i in list(graph.nodes) + list(graph.edges))
    assert all(not e.HasField("label") for e in graph.edges.values())


def test_deltas_and_usage_go_to_v0_peers() -> None:
    plan = rules("a && b")
    rid = str(uuid.uuid4())
    codec = JsonlCodec()
    for delta in plan_deltas(plan, rid):
        event = smith_pb2.Event(graph_delta=delta)
        line = codec.encode_event(event)
        assert codec.decode_event(line) == event
    first = json.loads(codec.encode_event(smith_pb2.Event(graph_delta=plan_deltas(plan, rid)[2])))
    assert first["type"] == "GraphDelta"
    (edge,) = first["data"]["edges_added"]
    assert edge["from"] == plan.steps[1].id and edge["to"] == plan.steps[0].id and edge["edge_type"] == "depends_on"
    usage = token_usage_event(Usage(120, 880, "m"), rid)
    assert (usage.request_id, usage.tokens_used, usage.tokens_remaining, usage.model) == (rid, 120, 880, "m")
    assert not token_usage_event(Usage(120, None, "m"), rid).HasField("tokens_remaining")
    v0 = json.loads(codec.encode_event(smith_pb2.Event(token_usage=usage)))
    assert v0 == {"type": "TokenUsage", "data": {"request_id": rid, "tokens_used": 120, "tokens_remaining": 880}}


# --- a chat-completions server -----------------------------------------------------------------


@dataclass
class Reply:
    """One canned answer of the fake model server."""

    content: str | None = None
    body: bytes | None = None  # overrides content
    status: int = 200
    reason: str | None = None
    usage: dict[str, int] | None = field(default_factory=lambda: {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150})
    model: str = "served-model-1"
    finish_reason: str = "stop"
    delay: float = 0.0
    framing: str = "length"  # length | chunked | close
    content_type: str = "application/json"

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body
        reply: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.content}, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            reply["usage"] = self.usage
        return json.dumps(reply).encode()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ModelServer:
    """``POST /v1/chat/completions`` on 127.0.0.1, answering the queued replies in order."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.requests.append(Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = outer.replies.popleft() if outer.replies else Reply(status=503, body=b"no reply queued")
                if reply.delay:
                    time.sleep(reply.delay)
                payload = reply.payload()
                try:
                    self.send_response(reply.status, reply.reason)
                    self.send_header("Content-Type", reply.content_type)
                    if reply.framing == "length":
                        self.send_header("Content-Length", str(len(payload)))
                    elif reply.framing == "chunked":
                        self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    if reply.framing == "chunked":
                        for i in range(0, len(payload), 7):
                            piece = payload[i : i + 7]
                            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
                    else:
                        self.wfile.write(payload)
                except OSError:  # the client gave up (the timeout test)
                    pass
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def planner(self, **kwargs: Any) -> LlmPlanner:
        kwargs.setdefault("timeout", 10.0)
        return LlmPlanner(self.base, kwargs.pop("model", "test-model"), kwargs.pop("api_key", None), **kwargs)


@pytest.fixture(scope="module")
def _model_server() -> Iterator[ModelServer]:
    server = ModelServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    server.thread.join(5)


@pytest.fixture
def model_server(_model_server: ModelServer) -> ModelServer:
    """The module's model server, with no queued replies and no recorded requests."""
    _model_server.replies.clear()
    _model_server.requests.clear()
    return _model_server


GOOD_PLAN = {
    "steps": [
        {"id": "build", "label": "Build", "kind": "shell", "command": "make", "depends_on": []},
        {"id": "test", "label": "Test", "kind": "shell", "command": "make test", "depends_on": ["build"]},
        {"id": "log", "label": "Read the log", "kind": "tool", "tool": "fs.read", "args": {"path": "test.log"}, "depends_on": ["test"]},
        {"id": "tell", "label": "Tell the team", "kind": "note", "depends_on": ["test"]},
    ]
}


@on_both_loops
async def test_llm_planner_asks_the_model(model_server: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMITH_PLANNER_API_KEY", "sk-test-123")
    tools = {"fs.read": "Read a file", "fs.write": "Write a file"}
    planner = planner_from_options("llm", model_server.base, "test-model", tools=tools, timeout=10)
    assert isinstance(planner, LlmPlanner) and isinstance(planner, Planner)
    assert "sk-test" not in repr(planner)
    model_server.replies.append(Reply(json.dumps(GOOD_PLAN)))
    context = {"token_budget": "1000", "traceparent": TRACEPARENT, "repo": "smith-fast", "branch": "main"}
    plan = await planner.plan("  Run the tests and report  ", context)

    assert [s.ref for s in plan.steps] == ["build", "test", "log", "tell"]
    build, test, log, tell = plan.steps
    assert (build.kind, build.command, build.label) == ("shell", "make", "Build")
    assert test.depends_on == (build.id,)
    assert (log.tool, log.args, log.depends_on) == ("fs.read", {"path": "test.log"}, (test.id,))
    assert (tell.kind, tell.label) == ("note", "Tell the team")
    assert plan.usage == Usage(150, 850, "served-model-1")
    assert plan.metadata == {"planner": "llm", "model": "served-model-1", "traceparent": TRACEPARENT}
    assert plan.goal == "  Run the tests and report  "

    (seen,) = model_server.requests
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == "Bearer sk-test-123"
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["traceparent"] == TRACEPARENT
    assert seen.headers["host"] == f"127.0.0.1:{model_server.port}"
    assert seen.headers["user-agent"].startswith("smith-fast/")
    body = seen.json()
    assert body["model"] == "test-model"
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0 and body["stream"] is False
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert '"steps"' in system["content"] and "- fs.read: Read a file\n- fs.write: Write a file" in system["content"]
    assert user["content"] == 'Goal:\nRun the tests and report\n\nContext:\n{\n "branch": "main",\n "repo": "smith-fast"\n}'


@on_both_loops
async def test_llm_planner_reply_variants(model_server: ModelServer) -> None:
    model_server.replies.extend(
        [
            Reply(f"Here is the plan:\n```json\n{json.dumps(GOOD_PLAN)}\n```\nGood luck!", framing="chunked", usage=None),
            Reply(json.dumps(GOOD_PLAN["steps"]), framing="close", usage={"prompt_tokens": 7, "completion_tokens": 3}),
            Reply(json.dumps(GOOD_PLAN), model="", usage={"total_tokens": 99}),
        ]
    )
    planner = LlmPlanner(model_server.base + "/chat/completions/", "m", json_mode=False, timeout=10)
    first = await planner.plan("g", {})
    assert len(first.steps) == 4 and first.usage is None
    second = await planner.plan("g", {"token_budget": "5"})
    assert second.usage == Usage(10, 0, "served-model-1")
    third = await planner.plan("g", {})
    assert third.usage == Usage(99, None, "m")
    for seen in model_server.requests:
        assert seen.path == "/v1/chat/completions"
        assert "authorization" not in seen.headers and "traceparent" not in seen.headers
        assert "response_format" not in seen.json()
        assert seen.json()["messages"][1]["content"] == "Goal:\ng"
    assert "No tools are available" in model_server.requests[0].json()["messages"][0]["content"]


CYCLE = {"steps": [{"id": "a", "command": "x", "depends_on": ["c"]}, {"id": "b", "command": "y", "depends_on": ["a"]},
                   {"id": "c", "command": "z", "depends_on": ["b"]}]}


@on_both_loops
@pytest.mark.parametrize(
    "reply, reason, message",
    [
        (Reply("Sure! First build, then test."), "invalid_json",
         "the model's plan is not valid JSON: Expecting value at line 1 column 1"),
        (Reply('{"steps": [{"id": "a", "command": "make"'), "invalid_json",
         "the model's plan is not valid JSON: Expecting ',' delimiter at line 1 column 41"),
        (Reply('{"steps": [', finish_reason="length"), "invalid_json",
         "the model's plan is not valid JSON: Expecting value at line 1 column 12 (the reply was cut off: finish_reason is \"length\")"),
        (Reply(json.dumps(CYCLE)), "invalid_plan",
         "the model's plan: dependency cycle: step 'a' -> 'c' -> 'b' -> 'a' (each step waits for the next)"),
        (Reply(json.dumps({"steps": [{"id": "a", "command": "x"}, {"id": "b", "command": "y", "depends_on": ["a", "deploy"]}]})),
         "invalid_plan", "the model's plan: step 2 (id 'b') depends on unknown step 'deploy'"),
        (Reply(json.dumps({"steps": [{"id": "a", "kind": "shell", "label": "Build"}]})), "invalid_plan",
         "the model's plan: step 1 (id 'a') needs a non-empty \"command\" string (missing)"),
        (Reply(json.dumps({"steps": [{"id": "a", "kind": "tool", "tool": "rm.rf"}]})), "invalid_plan",
         "the model's plan: step 1 (id 'a') uses unknown tool 'rm.rf' (known: fs.read)"),
        (Reply(json.dumps({"plan": "build it"})), "invalid_plan", "the model's plan is a JSON object without a \"steps\" list"),
        (Reply(json.dumps({"steps": []})), "invalid_plan", "the model's plan has no steps"),
    ],
)
async def test_llm_planner_rejects_bad_plans(model_server: ModelServer, reply: Reply, reason: str, message: str) -> None:
    model_server.replies.append(reply)
    with pytest.raises(PlanError) as info:
        await model_server.planner(tools={"fs.read": ""}).plan("build and test", {"token_budget": "100"})
    assert str(info.value) == message
    assert info.value.reason == reason
    assert info.value.code == smith_pb2.ERROR_CODE_UNSPECIFIED
    # The tokens were spent all the same: the error carries the usage.
    assert info.value.usage == (Usage(150, 0, "served-model-1") if reply.usage else None)
    assert len(model_server.requests) == 1


@on_both_loops
@pytest.mark.parametrize(
    "reply, reason, message, details",
    [
        (Reply(status=500, body=json.dumps({"error": {"message": "model overloaded", "type": "server_error"}}).encode()),
         "planner_http", "answered HTTP 500 Internal Server Error: model overloaded", {"http_status": "500"}),
        (Reply(status=401, reason="Unauthorized", body=b"invalid api key\n", content_type="text/plain"),
         "planner_http", "answered HTTP 401 Unauthorized: invalid api key", {"http_status": "401"}),
        (Reply(status=502, body=b""), "planner_http", "answered HTTP 502 Bad Gateway: (empty body)", {"http_status": "502"}),
        (Reply(body=b"<html>gateway</html>", content_type="text/html"), "planner_reply",
         "answered a body that is not JSON: '<html>gateway</html>'", {}),
        (Reply(body=b'{"object": "list", "data": []}'), "planner_reply",
         "answered JSON that is not a chat completion (no choices[0].message)", {}),
        (Reply(body=b'{"choices": []}'), "planner_reply", "answered JSON that is not a chat completion (no choices[0].message)", {}),
        (Reply(None), "planner_reply", "answered a chat completion without text in choices[0].message.content", {}),
    ],
)
async def test_llm_planner_bad_replies(
    model_server: ModelServer, reply: Reply, reason: str, message: str, details: dict[str, str]
) -> None:
    model_server.replies.append(reply)
    planner = model_server.planner()
    with pytest.raises(PlanError) as info:
        await planner.plan("g", {})
    assert str(info.value) == f"the planner endpoint {planner.endpoint} {message}"
    assert info.value.details == {"reason": reason, **details}
    assert info.value.usage is None


@on_both_loops
async def test_llm_planner_refusal(model_server: ModelServer) -> None:
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": None, "refusal": "I can't help with that."}}]})
    model_server.replies.append(Reply(body=body.encode()))
    with pytest.raises(PlanError, match=r"^the model refused to plan: I can't help with that\.$"):
        await model_server.planner().plan("g", {})


@on_both_loops
async def test_llm_planner_timeout(model_server: ModelServer) -> None:
    model_server.replies.append(Reply(json.dumps(GOOD_PLAN), delay=2.0))
    planner = model_server.planner(timeout=0.3)
    start = time.monotonic()
    with pytest.raises(PlanError) as info:
        await planner.plan("g", {})
    assert time.monotonic() - start < 1.5
    assert str(info.value) == f"the planner endpoint {planner.endpoint} did not answer within 0.3 s"
    assert info.value.code == smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT
    assert info.value.reason == "planner_timeout"


@on_both_loops
async def test_llm_planner_unreachable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    planner = LlmPlanner(f"http://127.0.0.1:{port}/v1", "m", timeout=5)
    with pytest.raises(PlanError) as info:
        await planner.plan("g", {})
    assert str(info.value).startswith(f"the planner endpoint http://127.0.0.1:{port}/v1/chat/completions: cannot connect to 127.0.0.1:{port}: ")
    assert info.value.reason == "planner_unavailable"


@on_both_loops
async def test_llm_planner_uses_context_steps_without_the_model(model_server: ModelServer) -> None:
    planner = model_server.planner(tools={"fs.read": "Read"})
    plan = await planner.plan("g", steps_context(GOOD_PLAN, traceparent=TRACEPARENT))
    assert len(plan.steps) == 4 and plan.usage is None
    assert plan.metadata == {"planner": "llm", "traceparent": TRACEPARENT}
    assert model_server.requests == []
    with pytest.raises(PlanError, match=r'^the goal is empty and the context has no "steps"$'):
        await planner.plan(" ", {})


def test_planner_options_and_urls() -> None:
    assert isinstance(planner_from_options("rules"), RulesPlanner)
    assert isinstance(planner_from_options("", None, None), RulesPlanner)
    assert planner_from_options("rules", tools={"fs.read": ""}).known_tools == {"fs.read"}  # type: ignore[attr-defined]
    llm = planner_from_options("LLM", "https://api.example.com/v1/", "gpt", environ={"SMITH_PLANNER_API_KEY": "k"})
    assert isinstance(llm, LlmPlanner)
    assert (llm.endpoint, llm.model, llm.api_key) == ("https://api.example.com/v1/chat/completions", "gpt", "k")
    assert planner_from_options("llm", "http://h/v1", "m", environ={}).api_key is None  # type: ignore[attr-defined]
    assert planner_from_options("llm", "http://h/v1", "m", api_key="x", environ={"SMITH_PLANNER_API_KEY": "k"}).api_key == "x"  # type: ignore[attr-defined]
    assert chat_completions_url("http://localhost:11434/v1") == "http://localhost:11434/v1/chat/completions"
    assert chat_completions_url("http://[::1]:8000/v1/chat/completions") == "http://[::1]:8000/v1/chat/completions"
    for name, url, model, message in [
        ("gpt", None, None, "unknown planner 'gpt'; choose one of rules, llm"),
        ("llm", None, "m", "--planner llm needs --planner-url (an OpenAI-compatible endpoint)"),
        ("llm", "http://h/v1", None, "--planner llm needs --planner-model"),
        ("llm", "ftp://h/v1", "m", "the planner URL 'ftp://h/v1' is not an http:// or https:// URL"),
        ("llm", "http://h/v1", " ", "the llm planner needs a model name (--planner-model)"),
    ]:
        with pytest.raises(PlanError) as info:
            planner_from_options(name, url, model, environ={})
        assert (str(info.value), info.value.reason) == (message, "planner_config")
    with pytest.raises(PlanError, match="API key holds a line break"):
        planner_from_options("llm", "http://h/v1", "m", environ={"SMITH_PLANNER_API_KEY": "k\r\nX-Evil: 1"})


@on_both_loops
async def test_http_client_edges(model_server: ModelServer) -> None:
    model_server.replies.append(Reply(body=b"x" * 100))
    with pytest.raises(HttpError, match="response body of 100 bytes is over the 10-byte limit"):
        await post(model_server.base, b"{}", {}, timeout=5, max_response=10)
    model_server.replies.append(Reply(body=b"x" * 100, framing="chunked"))
    with pytest.raises(HttpError, match="response body is over the 10-byte limit"):
        await post(model_server.base, b"{}", {}, timeout=5, max_response=10)
    model_server.replies.append(Reply(body=b"y" * 100, framing="close"))
    with pytest.raises(HttpError, match="response body is over the 10-byte limit"):
        await post(model_server.base, b"{}", {}, timeout=5, max_response=10)
    with pytest.raises(HttpError, match="holds a line break"):
        await post(model_server.base, b"{}", {"X-A": "1\r\nX-B: 2"}, timeout=5)
    with pytest.raises(HttpError, match="is not an http"):
        await post("file:///etc/passwd", b"", {}, timeout=5)
    model_server.replies.append(Reply(body=b"ok", status=201, reason="Made"))
    response = await post(model_server.base + "?q=1", b"hello", {"X-Custom": "v"}, timeout=5)
    assert (response.status, response.reason, response.body, response.headers["content-type"]) == (201, "Made", b"ok", "application/json")
    assert model_server.requests[-1].path == "/v1?q=1"
    assert model_server.requests[-1].body == b"hello" and model_server.requests[-1].headers["x-custom"] == "v"


@on_both_loops
async def test_http_client_malformed_responses() -> None:
    """A raw socket server sends what no HTTP server would."""
    answers = deque(
        [
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        ]
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.popleft())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    async with server:
        with pytest.raises(HttpError, match="does not start with an HTTP/1.x status line: 'SSH-2.0-OpenSSH"):
            await post(url, b"", {}, timeout=5)
        with pytest.raises(HttpError, match="closed the connection before the response was complete"):
            await post(url, b"", {}, timeout=5)
        assert (await post(url, b"", {}, timeout=5)).body == b"ok"
        with pytest.raises(HttpError, match="malformed response body: Invalid character in chunk size"):
            await post(url, b"", {}, timeout=5)
        with pytest.raises(HttpError, match="malformed response head: Invalid header token"):
            await post(url, b"", {}, timeout=5)


# --- execution ---------------------------------------------------------------------------------


class Runner:
    """Real step runners on a workspace: shell steps as processes, tool steps through the registry."""

    def __init__(self, root: Path, cwd: Path | None = None) -> None:
        self.root = root
        self.cwd = cwd or root
        self.registry = default_registry(entry_points=False)
        self.ctx = ToolContext(root)
        self.stdout: dict[str, bytes] = {}
        self.order: list[str] = []  # step refs in the order they finished
        self.deltas: list[smith_pb2.GraphDeltaEvent] = []
        self.graph = Graph()

    async def run_shell(self, step: Step) -> int:
        result = await run_collect(step.command or "", cwd=str(self.cwd), timeout=20)
        self.stdout[step.id] = result.stdout
        self.order.append(step.ref)
        assert result.exit_code is not None
        return result.exit_code

    async def run_tool(self, step: Step) -> Any:
        outcome = await self.registry.call(step.tool or "", step.args_json(), self.ctx)
        self.order.append(step.ref)
        return outcome

    def emit(self, delta: smith_pb2.GraphDeltaEvent) -> None:
        self.deltas.append(delta)
        self.graph.apply(delta)

    def executor(self, plan: Plan, rid: str = "", max_parallel: int = 4) -> PlanExecutor:
        for delta in plan_deltas(plan, rid):
            self.emit(delta)
        self.deltas.clear()
        return PlanExecutor(plan, rid, run_shell=self.run_shell, run_tool=self.run_tool, emit=self.emit, max_parallel=max_parallel)

    def max_running(self) -> int:
        """The most steps the deltas ever showed running at once."""
        running: set[str] = set()
        peak = 0
        for delta in self.deltas:
            node = delta.nodes_added[0]
            if node.node_type == "goal":
                continue
            if node.metadata["status"] == "running":
                running.add(node.id)
            else:
                running.discard(node.id)
            peak = max(peak, len(running))
        return peak


@on_both_loops
async def test_execute_a_shell_goal(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    plan = rules("echo one > f && echo two >> f; cat f\nprintf done")
    rid = str(uuid.uuid4())
    result = await runner.executor(plan, rid).run()
    assert result == {step.id: "succeeded" for step in plan.steps}
    assert (tmp_path / "f").read_text() == "one\ntwo\n"
    assert [runner.stdout[s.id] for s in plan.steps] == [b"", b"", b"one\ntwo\n", b"done"]
    assert runner.order == ["1", "2", "3", "4"]
    for delta in runner.deltas:  # every status change: remove and re-add one node, in one event
        assert delta.request_id == rid
        assert list(delta.nodes_removed) == [delta.nodes_added[0].id] and len(delta.nodes_added) == 1
        assert not delta.edges_added and not delta.edges_removed
    for step in plan.steps:
        assert runner.graph.history[step.id] == ["pending", "running", "succeeded"]
        meta = runner.graph.nodes[step.id].metadata
        assert meta["exit_code"] == "0" and int(meta["duration_ms"]) >= 0 and meta["command"] == step.command
    assert runner.graph.history[plan.goal_id] == ["pending", "running", "succeeded"]
    goal = runner.graph.nodes[plan.goal_id].metadata
    assert (goal["succeeded"], goal["failed"], goal["skipped"]) == ("4", "0", "0")
    assert len(runner.graph.edges) == 4  # 3 between steps + goal -> last: status deltas keep edges


@on_both_loops
async def test_failed_step_skips_its_dependents(tmp_path: Path) -> None:
    steps = [
        {"id": "a", "command": "echo a; exit 3"},
        {"id": "b", "command": "touch b", "depends_on": ["a"]},
        {"id": "c", "command": "touch c", "depends_on": ["b"]},
        {"id": "n", "kind": "note", "label": "look", "depends_on": ["c"]},
        {"id": "d", "command": "touch d", "after": ["a"]},
        {"id": "e", "command": "touch e", "after": ["c"]},
        {"id": "f", "command": "touch f"},
        {"id": "g", "kind": "note", "label": "fine", "depends_on": ["f"]},
    ]
    runner = Runner(tmp_path)
    plan = rules("g", steps=json.dumps(steps))
    s = by_ref(plan)
    result = await runner.executor(plan, max_parallel=1).run()
    assert {ref: result[step.id] for ref, step in s.items()} == {
        "a": "failed", "b": "skipped", "c": "skipped", "n": "skipped", "d": "succeeded", "e": "succeeded",
        "f": "succeeded", "g": "succeeded",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "e", "f"]  # b and c never ran
    assert runner.stdout[s["a"].id] == b"a\n"
    meta = runner.graph.nodes[s["a"].id].metadata
    assert (meta["status"], meta["exit_code"]) == ("failed", "3")
    assert runner.graph.history[s["b"].id] == ["pending", "skipped"]
    assert runner.graph.nodes[s["b"].id].metadata["blocked_by"] == s["a"].id
    assert runner.graph.nodes[s["c"].id].metadata["blocked_by"] == s["b"].id
    assert runner.graph.nodes[s["n"].id].metadata["blocked_by"] == s["c"].id
    assert runner.graph.history[s["g"].id] == ["pending", "succeeded"]
    assert runner.graph.history[plan.goal_id] == ["pending", "running", "failed"]
    goal = runner.graph.nodes[plan.goal_id].metadata
    assert (goal["succeeded"], goal["failed"], goal["skipped"]) == ("4", "1", "3")


@on_both_loops
async def test_independent_steps_run_in_parallel(tmp_path: Path) -> None:
    # Each step waits until all three exist: they can only all succeed if they run at once.
    wait_all = "touch {0}; for i in $(seq 100); do [ -e a ] && [ -e b ] && [ -e c ] && exit 0; sleep 0.05; done; exit 1"
    steps = [{"id": x, "command": wait_all.format(x)} for x in "abc"] + [
        {"id": "z", "command": "echo z", "depends_on": ["a", "b", "c"]}
    ]
    runner = Runner(tmp_path)
    plan = rules("g", steps=json.dumps(steps))
    result = await runner.executor(plan, max_parallel=3).run()
    assert set(result.values()) == {"succeeded"}
    assert runner.order[-1] == "z"
    assert runner.max_running() == 3


@on_both_loops
async def test_max_parallel_bounds_running_steps(tmp_path: Path) -> None:
    steps = [{"id": str(i), "command": f"sleep 0.05; echo {i}"} for i in range(6)]
    runner = Runner(tmp_path)
    plan = rules("g", steps=json.dumps(steps))
    result = await runner.executor(plan, max_parallel=2).run()
    assert set(result.values()) == {"succeeded"}
    assert runner.max_running() == 2
    nodes = [d.nodes_added[0] for d in runner.deltas]
    starts = [n.metadata["ref"] for n in nodes if n.node_type == "shell" and n.metadata["status"] == "running"]
    assert starts == [str(i) for i in range(6)]  # ready steps start in plan order


@on_both_loops
async def test_tool_steps_and_failures(tmp_path: Path) -> None:
    steps = [
        {"id": "w", "tool": "fs.write", "args": {"path": "out/x.txt", "content": "hi", "create_dirs": True}},
        {"id": "r", "tool": "fs.read", "args": {"path": "out/x.txt"}, "depends_on": ["w"]},
        {"id": "bad", "tool": "fs.read", "args": {"nope": 1}},
        {"id": "ghost", "tool": "no.such.tool"},
        {"id": "esc", "tool": "fs.read", "args": {"path": "../secret"}},
        {"id": "after_bad", "command": "echo ok", "depends_on": ["bad"]},
    ]
    runner = Runner(tmp_path)
    plan = rules("g", steps=json.dumps(steps))
    s = by_ref(plan)
    result = await runner.executor(plan).run()
    status = {ref: result[step.id] for ref, step in s.items()}
    assert status == {"w": "succeeded", "r": "succeeded", "bad": "failed", "ghost": "failed", "esc": "failed", "after_bad": "skipped"}
    assert (tmp_path / "out" / "x.txt").read_text() == "hi"
    meta = {ref: runner.graph.nodes[step.id].metadata for ref, step in s.items()}
    assert "error" not in meta["r"] and meta["r"]["tool"] == "fs.read"
    assert "'path' is a required property" in meta["bad"]["error"]  # from the tool's ToolOutcome
    assert meta["ghost"]["error"] == "unknown tool 'no.such.tool'"  # the registry's ProtocolError
    assert meta["esc"]["error"] == "path '../secret' is outside the workspace root"  # PERMISSION_DENIED


@on_both_loops
async def test_a_step_that_cannot_start_fails(tmp_path: Path) -> None:
    runner = Runner(tmp_path, cwd=tmp_path / "missing")
    plan = rules("echo a; echo b && echo c")
    result = await runner.executor(plan).run()
    a, b, c = plan.steps
    assert (result[a.id], result[b.id], result[c.id]) == ("failed", "failed", "skipped")
    error = runner.graph.nodes[a.id].metadata["error"]
    assert error == f"working directory {str(tmp_path / 'missing')!r} does not exist"
    assert "exit_code" not in runner.graph.nodes[a.id].metadata


@on_both_loops
async def test_cancel_stops_running_steps(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    plan = rules("{ echo $$ > pid; exec sleep 30; }\necho never > later && echo x")
    a, b, c = plan.steps
    task = asyncio.get_running_loop().create_task(runner.executor(plan).run())
    pid_file = tmp_path / "pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.02)
    pid = int(pid_file.read_text())
    assert runner.graph.status(a.id) == "running"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The step's process group was killed before the executor returned.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail(f"process {pid} outlived the cancelled plan")
    assert runner.graph.history[a.id] == ["pending", "running", "cancelled"]
    assert runner.graph.history[b.id] == ["pending", "cancelled"]
    assert runner.graph.history[c.id] == ["pending", "cancelled"]
    assert runner.graph.history[plan.goal_id] == ["pending", "running", "cancelled"]
    assert not (tmp_path / "later").exists()


@on_both_loops
async def test_executor_checks_its_input(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    a = Step(id=str(uuid.uuid4()), label="a", kind="shell", command="true", ref="a")
    b = Step(id=str(uuid.uuid4()), label="b", kind="shell", command="true", depends_on=(a.id,), ref="b")
    cyclic = Plan(str(uuid.uuid4()), "g", (Step(a.id, "a", "shell", "true", depends_on=(b.id,), ref="a"), b))
    with pytest.raises(PlanError, match=r"^the plan: dependency cycle: step 'a' -> 'b' -> 'a'"):
        PlanExecutor(cyclic, "", run_shell=runner.run_shell, run_tool=runner.run_tool, emit=runner.emit)
    dangling = Plan(str(uuid.uuid4()), "g", (b,))
    with pytest.raises(PlanError, match=r"^the plan: step 'b' waits for unknown step"):
        PlanExecutor(dangling, "", run_shell=runner.run_shell, run_tool=runner.run_tool, emit=runner.emit)
    # Steps given out of order still run in dependency order.
    backwards = Plan(str(uuid.uuid4()), "g", (b, a))
    executor = runner.executor(backwards)
    assert await executor.run() == {a.id: "succeeded", b.id: "succeeded"}
    assert runner.order == ["a", "b"]
    with pytest.raises(RuntimeError, match="runs once"):
        await executor.run()
    with pytest.raises(ValueError, match="max_parallel must be from 1 to 64, not 0"):
        PlanExecutor(backwards, "", run_shell=runner.run_shell, run_tool=runner.run_tool, emit=runner.emit, max_parallel=0)


@on_both_loops
@pytest.mark.parametrize(
    "goal",
    [
        "echo a; false && echo b; echo c",
        "echo 1 && false || echo 2; echo 3",
        "true && echo x && false && echo never\necho after",
        "if [ -e nothing ]; then echo yes; else echo no; fi && echo 'a;b' && echo \"$((2 + 3))\"",
        "cat <<EOF && echo done\nbody; with 'quotes'\nEOF\necho end # comment; echo hidden",
        "(exit 4) && echo skipped; echo \\\nrejoined",
        "cat <<EOF; echo x\nbody\nEOF\necho y",
        "for i in 1 2; do echo $i; done | tr '\\n' , ; echo; { echo b; false; } && echo no; echo yes",
    ],
)
async def test_steps_behave_like_sh(tmp_path: Path, goal: str) -> None:
    """Cutting a goal into steps and running them gives the output sh gives for the whole goal."""
    whole = await run_collect(goal, cwd=str(tmp_path), timeout=20)
    runner = Runner(tmp_path)
    plan = rules(goal)
    await runner.executor(plan, max_parallel=4).run()
    out = b"".join(runner.stdout.get(step.id, b"") for step in plan.steps)
    assert out == whole.stdout
    assert len(plan.steps) > 1


@on_both_loops
async def test_run_plan_command(tmp_path: Path, model_server: ModelServer) -> None:
    runner = Runner(tmp_path)
    events: list[smith_pb2.Event] = []
    rid = str(uuid.uuid4())

    # Without "execute": the plan is drawn and nothing runs.
    command = smith_pb2.PlanCommand(request_id=rid, goal="touch a && touch b", context={})
    plan, statuses = await run_plan_command(command, RulesPlanner(), emit=events.append, run_shell=runner.run_shell, run_tool=runner.run_tool)
    assert statuses is None and len(events) == 4 and not list(tmp_path.iterdir())
    assert {e.WhichOneof("event_type") for e in events} == {"graph_delta"}

    # With it, and a model: usage first, then the graph, then the status changes.
    events.clear()
    steps = {"steps": [{"id": "1", "command": "touch made"}, {"id": "2", "command": "exit 1", "depends_on": ["1"]},
                       {"id": "3", "command": "touch never", "depends_on": ["2"]}]}
    model_server.replies.append(Reply(json.dumps(steps)))
    command = smith_pb2.PlanCommand(request_id=rid, goal="g", context={"execute": "true", "max_parallel": "2", "token_budget": "200"})
    plan, statuses = await run_plan_command(
        command, model_server.planner(), emit=events.append, run_shell=runner.run_shell, run_tool=runner.run_tool
    )
    kinds = [e.WhichOneof("event_type") for e in events]
    assert kinds == ["token_usage"] + ["graph_delta"] * (5 + 7)
    assert events[0].token_usage == smith_pb2.TokenUsageEvent(request_id=rid, tokens_used=150, tokens_remaining=50, model="served-model-1")
    assert statuses == dict(zip([s.id for s in plan.steps], ["succeeded", "failed", "skipped"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made"]
    graph = Graph()
    for event in events[1:]:
        graph.apply(event.graph_delta)
    assert graph.status(plan.goal_id) == "failed"

    # A rejected plan still reports the tokens it cost, then raises.
    events.clear()
    model_server.replies.append(Reply("not json"))
    with pytest.raises(PlanError, match="not valid JSON"):
        await run_plan_command(command, model_server.planner(), emit=events.append, run_shell=runner.run_shell, run_tool=runner.run_tool)
    assert [e.WhichOneof("event_type") for e in events] == ["token_usage"]

    # A bad context value is refused before any planning.
    bad = smith_pb2.PlanCommand(request_id=rid, goal="g", context={"max_parallel": "100"})
    with pytest.raises(PlanError, match=r'context\["max_parallel"\]'):
        await run_plan_command(bad, model_server.planner(), emit=events.append, run_shell=runner.run_shell, run_tool=runner.run_tool)
    assert len(model_server.requests) == 2
