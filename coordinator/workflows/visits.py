"""The moves every form of workflow shares (pure): begin a visit of a step (or state),
settle it, stop it, and end the instance well, badly, or past its deadline."""

from __future__ import annotations

from typing import Any

import msgspec

from agentreach.coordinator.workflows.actions import (
    Abandon,
    Dispatch,
    Finish,
    Note,
    Timer,
    ending,
    message_id_of,
)
from agentreach.coordinator.workflows.deadline import expiry
from agentreach.coordinator.workflows.nesting import too_deep
from agentreach.coordinator.workflows.saga import Compensation
from agentreach.coordinator.workflows.templates import MissingPath
from agentreach.envelopes import ErrorInfo, Priority, StepRun
from agentreach.envelopes.coordination import StepStatus, visit_key


class Visits(Compensation):
    """What :class:`~agentreach.coordinator.workflows.run.Run` builds on."""

    def _begin(
        self,
        key: str,
        intent: str | None,
        payload: Any,
        timeout_s: float | None,
        priority: Priority | None,
    ) -> StepRun:
        previous = self.record.steps.get(key)
        if previous is not None:
            self._keep_replaced(key, previous)
        visit = (previous.visit if previous else 0) + 1
        run = StepRun(
            visit=visit,
            message_id=message_id_of(self.record.instance_id, key, visit),
            intent=intent or "",
            input=payload,
            started_ms=self.now,
            priority=priority or self.record.task.priority,
        )
        self.record.steps[key] = run
        if intent is None:
            run.status, run.output, run.ended_ms = "completed", payload, self.now
            return run
        run.status = "running"
        if timeout_s is not None:
            run.deadline_ms = self.now + int(timeout_s * 1000)
            self.actions.append(Timer(key, visit, run.deadline_ms))
        self.actions.append(Dispatch(key, run))
        return run

    def _keep_replaced(self, key: str, previous: StepRun) -> None:
        """Keep a visit the next one replaces when it has an effect to undo: done (a state
        entered again: its undo was lost, one per state), or stopped while it ran (a step's
        first run replaced by its fallback, a state timed out and entered again: done late,
        it was never undone)."""
        compensates = self.spec.on_failure == "compensate" and self.spec.compensation_of(key)
        if not (previous.intent and compensates):
            return
        if previous.status not in ("completed", "cancelled", "timed_out"):
            return  # failed, or stopped and then refused: nothing of it to undo
        if previous.status != "completed" and not previous.sent:
            return  # stopped before its task went out
        replaced = visit_key(key, previous.visit)
        self.record.replaced[replaced] = previous
        order = self.record.completed_order
        if previous.status == "completed" and key in order:  # its completion: of that visit
            order[len(order) - 1 - order[::-1].index(key)] = replaced

    def _input_missing(self, key: str, intent: str | None, missing: MissingPath) -> StepRun:
        """A visit whose input names nothing fails at once, no task sent, saying the path.
        Its run names the step's intent: its event's topic is the one its task would have had."""
        previous = self.record.steps.get(key)
        visit = (previous.visit if previous else 0) + 1
        message = f"step {key!r} was not started: {missing}"
        run = StepRun(
            status="failed",
            visit=visit,
            message_id=message_id_of(self.record.instance_id, key, visit),
            intent=intent or "",
            error=ErrorInfo(type="input_missing", message=message, retryable=False),
            started_ms=self.now,
            ended_ms=self.now,
            priority=self.record.task.priority,
        )
        self.record.steps[key] = run
        detail = {"path": f"$.{missing.path}", "error": msgspec.to_builtins(run.error)}
        self.actions.append(Note("step_input_missing", key, detail))
        return run

    def _settle(self, run: StepRun, *, output: Any, error: ErrorInfo | None) -> None:
        run.status = "failed" if error is not None else "completed"
        run.output, run.error, run.ended_ms = output, error, self.now

    def _outputs(self) -> dict[str, Any]:
        return {k: r.output for k, r in self.record.steps.items() if r.status == "completed"}

    def _complete(self, result: Any) -> None:
        self.record.status, self.record.result, self.record.ended_ms = "completed", result, self.now
        self._cancel_leftovers()
        # The result, as a task's `completed` carries it: a starter that sends its message
        # again (within the duplicate window, so the stream drops it) is answered from it.
        self.actions.extend((Finish(), ending(self.record)))

    def _fail(self, error: ErrorInfo, *, stopped: list[str] | None = None) -> None:
        """End as failed; ``stopped`` names steps stopped just before while they ran (one
        that timed out), whose outcome a saga waits for like the running ones'."""
        self._end_badly(error, "failed", running=[*(stopped or []), *self._cancel_leftovers()])

    def _cancel_leftovers(self) -> list[str]:
        """Stop every step not done; the ones whose tasks were sent (they go on)."""
        sent: list[str] = []
        for key, run in self.record.steps.items():
            if run.status in ("running", "waiting") and self._stop(key, run, "cancelled"):
                sent.append(key)
        return sent

    def _stop(self, key: str, run: StepRun, status: StepStatus) -> bool:
        """``run`` ends as ``status``; True when its task was sent and may go on (a child
        workflow is let go). One this very change was about to send is not sent at all."""
        unsent = run.status == "running" and self._unsend(run)
        sent = run.status == "running" and not unsent
        if sent:
            self.actions.append(Abandon(key, run))
        if unsent:  # no such message ever went out: nothing ran (see steps_began)
            run.message_id = ""
        run.status, run.ended_ms = status, self.now
        return sent

    def _unsend(self, run: StepRun) -> bool:
        """Drop the dispatch of ``run`` this change holds, if it holds one."""
        for index, action in enumerate(self.actions):
            if isinstance(action, Dispatch) and action.run is run:
                del self.actions[index]
                return True
        return False

    # -- limits -----------------------------------------------------------------------
    def _too_deep(self) -> bool:
        """Whether this instance runs too far below the one a caller started (it failed)."""
        if (error := too_deep(self.record)) is not None:
            self._fail(error)
        return error is not None

    def _past_deadline(self) -> bool:
        """Whether the deadline passed (its timer may come late): the instance expired."""
        if self.now < self.record.deadline_ms:
            return False
        self._expire()
        return True

    def _expire(self) -> None:
        self._fail(expiry(self.record, self.spec))


def timeout_error(key: str, timeout_s: float | None, part: str = "step") -> ErrorInfo:
    message = f"{part} {key!r} did not finish within {timeout_s:g} s"
    return ErrorInfo(type="timeout", message=message, retryable=False)


def named(where: str, error: ErrorInfo) -> ErrorInfo:
    """A step's error as the instance fails with it: saying which step (a starter reads
    "step 'charge': no agent serves topic 'charge'", not the bare topic)."""
    return msgspec.structs.replace(error, message=f"{where}: {error.message}")
