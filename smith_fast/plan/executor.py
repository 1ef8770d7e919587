"""Run a plan: each step as soon as what it waits for allows, a bounded number at a time.

Rules (``docs/PLANS.md``, "Execution"):

* A step starts when every ``depends_on`` step *succeeded* and every ``after`` step *finished*
  (succeeded, failed or skipped). Ready steps start in plan order, at most ``max_parallel`` at once.
* A step whose ``depends_on`` step failed or was skipped is skipped, and so on transitively; its
  ``after`` relations never skip it (``a ; b`` runs ``b`` whatever ``a`` did, as ``sh`` does).
* A shell step succeeds with exit code 0; a tool step when ``run_tool`` says so; a note step
  succeeds at once (there is nothing to run). An exception from ``run_shell``/``run_tool`` fails
  the step, its message in the node's ``error``.
* Every status change is one ``GraphDeltaEvent`` removing and re-adding the node:
  ``pending → running → succeeded | failed``, ``pending → skipped``, ``pending → succeeded``
  (notes). The goal node goes ``pending → running → succeeded | failed`` (failed if any step did
  not succeed).
* Cancelled (the request was cancelled, the peer left): running steps are cancelled and awaited
  (``run_collect``-style runners kill their process group), then every unfinished step and the
  goal become ``cancelled``, then :class:`asyncio.CancelledError` propagates.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ProtocolError
from ..pb import smith_pb2
from .graph import goal_node, status_delta, step_node
from .model import (
    CANCELLED,
    FAILED,
    FINAL_STATUSES,
    NOTE,
    PENDING,
    RUNNING,
    SHELL,
    SKIPPED,
    SUCCEEDED,
    Plan,
    Step,
)
from .options import MAX_PARALLEL
from .schema import order_steps

__all__ = ["Emit", "PlanExecutor", "RunShell", "RunTool"]

RunShell = Callable[[Step], Awaitable[int]]
"""Runs a shell step (streaming its output under ``request_id = step.id``); returns the exit code."""
RunTool = Callable[[Step], Awaitable[Any]]
"""Runs a tool step; returns whether it succeeded (a ``bool``, or a ``ToolOutcome`` whose ``error``
then shows in the node)."""
Emit = Callable[[smith_pb2.GraphDeltaEvent], None]

_MAX_ERROR = 1000


def _describe(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, ProtocolError) else f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 1] + "…"


def _ms(start: float) -> str:
    return str(round((time.monotonic() - start) * 1000))


class PlanExecutor:
    """Runs one plan once.

    Args:
        plan: the plan (checked again here: unknown dependencies or a cycle raise).
        request_id: the ``PlanCommand``'s request id, set on every delta.
        run_shell: runs a shell step, returns its exit code (the session streams its output as
            ``ShellOutput`` events with ``request_id = step.id`` and applies its hooks).
        run_tool: runs a tool step, returns ``True``/``False`` or a ``ToolOutcome``.
        emit: receives each status delta, synchronously, in order.
        max_parallel: the most shell and tool steps running at once (1 to 64).

    Raises:
        PlanError: the plan has an unknown dependency or a cycle.
        ValueError: ``max_parallel`` is out of range.

    Attributes:
        statuses: step id → current status.
        goal_status: the goal's current status.
    """

    def __init__(
        self,
        plan: Plan,
        request_id: str,
        *,
        run_shell: RunShell,
        run_tool: RunTool,
        emit: Emit,
        max_parallel: int = 4,
    ) -> None:
        if not 1 <= max_parallel <= MAX_PARALLEL:
            raise ValueError(f"max_parallel must be from 1 to {MAX_PARALLEL}, not {max_parallel}")
        self.plan = plan
        self.request_id = request_id
        self.max_parallel = max_parallel
        self._order = order_steps(plan.steps)
        self._run_shell = run_shell
        self._run_tool = run_tool
        self._emit = emit
        self.statuses: dict[str, str] = {step.id: PENDING for step in plan.steps}
        self.goal_status = PENDING
        self._started = False
        # Event-driven bookkeeping, so each status change costs O(its dependents), not O(plan):
        # how many prerequisites of each step are not final yet, and who waits for each step.
        self._pos = {step.id: i for i, step in enumerate(self._order)}
        self._by_id = {step.id: step for step in self._order}
        self._unresolved = {step.id: len(set(step.depends_on + step.after)) for step in self._order}
        self._dependents: dict[str, list[Step]] = {step.id: [] for step in self._order}
        for step in self._order:
            for dep in dict.fromkeys(step.depends_on + step.after):
                self._dependents[dep].append(step)
        self._blocked_by: dict[str, str] = {}
        # Steps to skip or complete at once (skips, notes), and shell/tool steps ready to start:
        # heaps of (topological position, step id), so both happen in plan order.
        self._instant: list[tuple[int, str]] = []
        self._runnable: list[tuple[int, str]] = []
        # Each node's static part, built once; a status change copies it and sets the status.
        index = {step.id: i for i, step in enumerate(plan.steps, 1)}
        self._nodes = {step.id: step_node(step, index[step.id]) for step in plan.steps}

    # ---- status changes ------------------------------------------------------------------------

    def _set(self, step: Step, status: str, extra: dict[str, str] | None = None) -> None:
        self.statuses[step.id] = status
        node = smith_pb2.GraphNode()
        node.CopyFrom(self._nodes[step.id])
        node.metadata["status"] = status
        if extra:
            node.metadata.update(extra)
        self._emit(status_delta(node, self.request_id))
        if status in FINAL_STATUSES:
            self._resolve(step, status)

    def _set_goal(self, status: str, extra: dict[str, str] | None = None) -> None:
        self.goal_status = status
        self._emit(status_delta(goal_node(self.plan, status, extra), self.request_id))

    # ---- scheduling ----------------------------------------------------------------------------

    def _enqueue(self, step: Step) -> None:
        heap = self._instant if step.id in self._blocked_by or step.kind == NOTE else self._runnable
        heapq.heappush(heap, (self._pos[step.id], step.id))

    def _resolve(self, step: Step, status: str) -> None:
        """``step`` reached a final status: update the steps that wait for it."""
        for dependent in self._dependents[step.id]:
            if self.statuses[dependent.id] != PENDING:
                continue  # already skipped (another of its dependencies failed first)
            self._unresolved[dependent.id] -= 1
            if status != SUCCEEDED and step.id in dependent.depends_on and dependent.id not in self._blocked_by:
                self._blocked_by[dependent.id] = step.id
                heapq.heappush(self._instant, (self._pos[dependent.id], dependent.id))
            elif self._unresolved[dependent.id] == 0 and dependent.id not in self._blocked_by:
                self._enqueue(dependent)

    def _settle(self, running: dict[asyncio.Task[tuple[bool, dict[str, str]]], Step]) -> None:
        """Skip the doomed steps, complete the ready notes, start ready steps while there is room."""
        while self._instant:
            _, step_id = heapq.heappop(self._instant)
            if self.statuses[step_id] != PENDING:
                continue
            step = self._by_id[step_id]
            blocker = self._blocked_by.get(step_id)
            if blocker is not None:
                self._set(step, SKIPPED, {"blocked_by": blocker})
            else:
                self._set(step, SUCCEEDED)
        loop = asyncio.get_running_loop()
        while self._runnable and len(running) < self.max_parallel:
            _, step_id = heapq.heappop(self._runnable)
            step = self._by_id[step_id]
            self._set(step, RUNNING)
            running[loop.create_task(self._run_step(step))] = step

    async def _run_step(self, step: Step) -> tuple[bool, dict[str, str]]:
        start = time.monotonic()
        extra: dict[str, str] = {}
        try:
            if step.kind == SHELL:
                code = await self._run_shell(step)
                extra["exit_code"] = str(code)
                ok = code == 0
            else:
                result = await self._run_tool(step)
                ok = bool(getattr(result, "success", result))
                error = getattr(result, "error", None)
                if not ok and isinstance(error, str) and error:
                    extra["error"] = error[:_MAX_ERROR]
        except Exception as exc:  # noqa: BLE001 - a step that cannot run fails; the plan goes on
            ok = False
            extra["error"] = _describe(exc)
        extra["duration_ms"] = _ms(start)
        return ok, extra

    async def run(self) -> dict[str, str]:
        """Run every step that can run, emitting each status change.

        Returns:
            Step id → final status: ``succeeded``, ``failed`` or ``skipped``.

        Raises:
            asyncio.CancelledError: the run was cancelled; running steps were cancelled and awaited,
                and the unfinished steps and the goal reported ``cancelled``, first.
            RuntimeError: :meth:`run` was called before.
        """
        if self._started:
            raise RuntimeError("a PlanExecutor runs once")
        self._started = True
        start = time.monotonic()
        running: dict[asyncio.Task[tuple[bool, dict[str, str]]], Step] = {}
        try:
            self._set_goal(RUNNING)
            for step in self._order:
                if self._unresolved[step.id] == 0:
                    self._enqueue(step)
            self._settle(running)
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: self._pos[running[t].id]):
                    step = running.pop(task)
                    if task.cancelled():  # cancelled from inside the runner, not by us
                        ok, extra = False, {"error": "the step was cancelled"}
                    else:
                        ok, extra = task.result()
                    self._set(step, SUCCEEDED if ok else FAILED, extra)
                self._settle(running)
        except BaseException:
            await self._stop(running)
            self._cancel_rest()
            raise
        counts = {status: 0 for status in (SUCCEEDED, FAILED, SKIPPED)}
        for status in self.statuses.values():
            counts[status] += 1
        goal = SUCCEEDED if counts[SUCCEEDED] == len(self.statuses) else FAILED
        self._set_goal(goal, {**{k: str(v) for k, v in counts.items()}, "duration_ms": _ms(start)})
        return dict(self.statuses)

    async def _stop(self, running: dict[asyncio.Task[tuple[bool, dict[str, str]]], Step]) -> None:
        """Cancel the running steps and wait until they are gone, even if cancelled again meanwhile."""
        tasks = set(running)
        for task in tasks:
            task.cancel()
        while tasks:
            try:
                await asyncio.wait(tasks)
                return
            except asyncio.CancelledError:
                # The caller's cancellation is already on its way out (we re-raise after); the
                # children must be gone first, or their processes would outlive the request.
                tasks = {t for t in tasks if not t.done()}
                for task in tasks:
                    task.cancel()

    def _cancel_rest(self) -> None:
        """Report every unfinished step, and the goal, as cancelled. Best effort: the emitter may
        be what failed."""
        try:
            for step in self._order:
                if self.statuses[step.id] not in FINAL_STATUSES:
                    self._set(step, CANCELLED)
            if self._started and self.goal_status not in FINAL_STATUSES:
                self._set_goal(CANCELLED)
        except Exception:  # noqa: BLE001 - the original exception is the one to propagate
            pass
