"""Fuzz plan goals: what a peer's ``PlanCommand`` makes the rules planner read (found by review:
a goal of ``$(`` repeated was a ``RecursionError``, an ``INTERNAL_ERROR`` a peer could reach at will).

Input layout: the first byte picks what the rest is (``mode = data[0] % 3``):

* 0: a shell goal (the default ``goal_kind``), split into steps by :mod:`smith_fast.plan.shellsplit`;
* 1: ``context["steps"]``, a JSON plan the peer wrote itself (goal ``g``);
* 2: a goal and a context: the rest split at the first ``\\x00`` into the goal and ``key=value``
  lines (``goal_kind``, ``execute``, ``steps`` …).

Checked on every input: the planner returns a plan or raises :class:`~smith_fast.plan.PlanError`
(a ``ProtocolError`` whose code is never ``INTERNAL_ERROR``), and nothing else; it does so within
a stack budget (200 frames above the caller, as the service's own call depth leaves far more); a
plan has at most ``max_steps`` steps and draws as ``len(steps) + 2`` graph deltas.
"""

from __future__ import annotations

import sys

from fuzz._common import fuzz_main, instrumented

with instrumented(__name__):
    from smith_fast.pb import smith_pb2 as pb
    from smith_fast.plan import PlanError
    from smith_fast.plan.graph import plan_deltas
    from smith_fast.plan.rules import RulesPlanner

PLANNER = RulesPlanner(known_tools=("fs.read", "fs.write", "shell.run"))
STACK = 200  # frames the planner may use above its caller


def _depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


def _inputs(data: bytes) -> tuple[str, dict[str, str]]:
    mode, rest = (data[0] % 3, data[1:]) if data else (0, b"")
    text = rest.decode("utf-8", "replace")
    if mode == 0:
        return text, {}
    if mode == 1:
        return "g", {"steps": text}
    goal, _, lines = text.partition("\x00")
    context = dict(line.partition("=")[::2] for line in lines.splitlines() if "=" in line)
    return goal, context


def test_one_input(data: bytes) -> None:
    goal, context = _inputs(data)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + STACK)
    try:
        plan = PLANNER.plan_now(goal, context)
    except PlanError as exc:
        assert exc.code != pb.ERROR_CODE_INTERNAL_ERROR, exc
        assert str(exc), "a PlanError says what is wrong"
        return
    except RecursionError as exc:  # the planner's own depth, whatever the input
        raise AssertionError(f"RecursionError within {STACK} frames on a {len(goal)}-character goal") from exc
    finally:
        sys.setrecursionlimit(limit)
    assert 0 < len(plan.steps) <= PLANNER.max_steps
    assert len(plan_deltas(plan, "r")) == len(plan.steps) + 2


if __name__ == "__main__":
    fuzz_main(test_one_input)
