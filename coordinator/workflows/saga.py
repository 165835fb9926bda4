"""The saga half of a workflow run: with ``on_failure: compensate``, the completed steps'
compensating intents run one at a time, latest first, before the run ends badly (pure)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentreach.coordinator.workflows.actions import Action, Dispatch, Finish, Note, message_id_of
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, StepRun, WorkflowRecord
from agentreach.envelopes.coordination import UNDO


def final_error(error: ErrorInfo) -> ErrorInfo:
    """``error`` as an instance ends with it: never retryable. The instance's id is its
    starting message's, and that message sent again is answered with how the instance ended
    (for as long as the record is kept), so it never runs again; the error of the step that
    failed it stays as it was in the step's record."""
    if error.retryable or error.retry_after_ms is not None:
        return msgspec.structs.replace(error, retryable=False, retry_after_ms=None)
    return error


class Compensation:
    """What :class:`~agentreach.coordinator.workflows.run.Run` does once a run fails or is
    cancelled."""

    spec: WorkflowSpec
    record: WorkflowRecord
    now: int
    actions: list[Action]

    def _end_badly(self, error: ErrorInfo, ending: Literal["failed", "cancelled"]) -> None:
        self.record.error, self.record.ending = final_error(error), ending
        if self.spec.on_failure == "compensate" and self._to_undo():
            self.record.status = "compensating"
            self.actions.append(Note("compensating", detail={"undo": self._to_undo()}))
            self._compensate_next()
            return
        self._finish_badly()

    def _finish_badly(self) -> None:
        self.record.status = self.record.ending or "failed"
        if self.record.ended_ms:  # ended before: a late step's undo is all that happened since
            return
        self.record.ended_ms = self.now
        error = self.record.error
        self.actions.append(Finish())
        self.actions.append(
            Note(
                f"workflow_{self.record.status}",
                detail={"error": msgspec.to_builtins(error), "ran": self.record.steps_began},
            )
        )

    def _to_undo(self) -> list[str]:
        """Completed steps with a compensating intent, not yet undone, latest first."""
        undone = self.record.compensations
        pending = (k for k in reversed(self.record.completed_order) if k not in undone)
        return list(dict.fromkeys(k for k in pending if self.spec.compensation_of(k)))

    def _compensate_next(self) -> None:
        if any(r.status == "running" for r in self.record.compensations.values()):
            return
        pending = self._to_undo()
        if not pending:
            self._finish_badly()
            return
        key = pending[0]
        done = self.record.steps[key]
        run = StepRun(
            status="running",
            visit=done.visit,
            message_id=message_id_of(self.record.instance_id, key, UNDO),
            intent=self.spec.compensation_of(key) or "",
            input={"step": key, "input": done.input, "output": done.output},
            started_ms=self.now,
            priority=done.priority,
        )
        self.record.compensations[key] = run
        self.actions.append(Dispatch(f"{key}-undo", run))

    def _undo_late(self, key: str, run: StepRun, output: Any) -> bool:
        """A step cancelled while it ran (the workflow cancelled or failed meanwhile), or timed
        out, ended with a result after all: its effect happened, so with ``on_failure:
        compensate`` it is undone like the steps completed before, once the workflow ended
        badly; False when there is nothing to undo."""
        if self.spec.on_failure != "compensate" or not self.spec.compensation_of(key):
            return False
        if self.record.ending is None or key in self.record.compensations:
            return False
        run.status, run.output, run.error, run.ended_ms = "completed", output, None, self.now
        self.record.completed_order.append(key)
        self.actions.append(Note("compensating_late_step", key))
        self.record.status = "compensating"
        self._compensate_next()
        return True
