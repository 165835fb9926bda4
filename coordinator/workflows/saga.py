"""The saga half of a workflow run: with ``on_failure: compensate``, the completed steps'
compensating intents run one at a time, latest first, before the run ends badly (pure).

A step still running when the run fails or is cancelled is stopped (nothing waits for its
result any more), but its task may complete all the same, and then it is the latest step
done. So, when it has a compensating intent, the undoing first waits for its outcome
(``record.awaiting``): done, it is undone first; failed or refused, there is nothing of it
to undo. The wait lasts until the step's own deadline (its ``timeout_s``, else its
starting task's execute budget) and ``LATE_GRACE_MS`` more, at least ``LATE_GRACE_MS`` from
the end; a result after that is still undone, last (event ``compensating_late_step``).
The starter is answered, and ``workflow_failed`` / ``workflow_cancelled`` published, once
the last undo has ended. A step that timed out failing the run is waited for the same way,
and so is a step that runs a child instance: cancelled with this one, it undoes its own
steps and then answers, and this one is undone (and answers) only after that.

A completed run undoes too: a step it stopped at its end (a branch its join went on
without, say) that completes after all is undone alone, and the run stays completed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

import msgspec

from agentreach.coordinator.workflows.actions import (
    Action,
    Dispatch,
    Finish,
    Note,
    Timer,
    ending,
)
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, StepRun, WorkflowRecord
from agentreach.envelopes.coordination import step_of, undo_message_id

LATE = ".late"  # "<step>.late": the timer of the wait for a stopped step's outcome
# A step's task that overran its deadline is judged by the coordinator's delivery, and its
# retry refused (an error the instance hears), within an ack wait (5 s): wait that long more.
LATE_GRACE_MS = 5_000


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
    workflows: Collection[str]

    def _end_badly(
        self,
        error: ErrorInfo,
        ending: Literal["failed", "cancelled"],
        *,
        running: list[str] | None = None,
    ) -> None:
        """End as ``ending``, undoing first with ``on_failure: compensate``; ``running``
        names the steps just stopped while they ran."""
        self.record.error, self.record.ending = final_error(error), ending
        if self.spec.on_failure == "compensate":
            awaited = [key for key in running or [] if self._undone_on_its_own(key)]
            awaited += self._replaced_running()
            if awaited or self._to_undo():
                self.record.status = "compensating"
                self._await(awaited)
                detail: dict[str, Any] = {"undo": self._to_undo()}
                if awaited:
                    detail["waiting_for"] = awaited
                self.actions.append(Note("compensating", detail=detail))
                self.actions.extend(self._late_timers())
                self._compensate_next()
                return
        self._finish_badly()

    def _replaced_running(self) -> list[str]:
        """Replaced visits stopped while they ran whose outcome may still come (a step's first
        run, replaced by its fallback): the undoing waits for them as for the steps stopped."""
        return [
            key
            for key, run in self.record.replaced.items()
            if run.status in ("cancelled", "timed_out")
            and run.sent
            and key not in self.record.compensations
        ]

    def _undone_on_its_own(self, key: str) -> bool:
        """Whether stopped step ``key`` has an undo to wait for: a compensating intent, or
        a child instance's own undoing (cancelled with this one, it answers once undone)."""
        return bool(self.spec.compensation_of(key)) or self.record.steps[key].intent in (
            self.workflows
        )

    def _finish_badly(self) -> None:
        self.record.status = self.record.ending or "failed"
        if self.record.ended_ms:  # ended before: a late step's undo is all that happened since
            return
        self.record.ended_ms = self.now
        if undo_failed := self._undo_failed():
            # The starter must be able to tell a clean rollback from a partial one.
            self.record.error = _with_undo_failed(self.record.error, undo_failed)
        self.actions.extend((Finish(), ending(self.record)))

    def _undo_failed(self) -> list[str]:
        """The completed steps whose undo failed: their effects stand."""
        return [k for k, run in self.record.compensations.items() if run.status == "failed"]

    def _to_undo(self) -> list[str]:
        """Completed steps with a compensating intent, not yet undone, latest first."""
        undone = self.record.compensations
        pending = (k for k in reversed(self.record.completed_order) if k not in undone)
        return list(dict.fromkeys(k for k in pending if self.spec.compensation_of(step_of(k))))

    def _compensate_next(self) -> None:
        if self.record.awaiting:
            return  # a stopped step may still be done: it would be the first to undo
        if any(r.status == "running" for r in self.record.compensations.values()):
            return
        pending = self._to_undo()
        if not pending:
            self._finish_badly()
            return
        self._dispatch_undo(pending[0])

    def _dispatch_undo(self, key: str) -> None:
        done = self.record.run_of(key)
        run = StepRun(
            status="running",
            visit=done.visit,
            message_id=undo_message_id(self.record.instance_id, key, done.visit),
            intent=self.spec.compensation_of(step_of(key)) or "",
            # Not a copy of the step's input and output: the dispatch builds its payload from
            # them (a copy doubled the record's largest parts, past what a message holds).
            input={"step": key},
            started_ms=self.now,
            priority=done.priority,
        )
        self.record.compensations[key] = run
        self.actions.append(Dispatch(f"{key}-undo", run))

    # -- steps stopped while they ran -----------------------------------------------------
    def _await(self, keys: list[str]) -> None:
        """Wait for the outcome of ``keys`` before undoing anything, each until its deadline
        (kept in its run, so that the timer armed again after a crash is the same one); a
        child instance, whose answer comes once it has undone its own steps, that much
        longer again (its undos' budget)."""
        budget_ms = self.record.task.budget.execute_ms
        for key in keys:
            run = self.record.run_of(key)
            own = run.deadline_ms or run.started_ms + budget_ms
            undoing_ms = budget_ms if run.intent in self.workflows else 0
            run.deadline_ms = max(own, self.now) + LATE_GRACE_MS + undoing_ms
        self.record.awaiting = keys

    def _late_timers(self) -> list[Timer]:
        runs = [(k, self.record.run_of(k)) for k in self.record.awaiting]
        return [Timer(k + LATE, run.visit, run.deadline_ms) for k, run in runs]

    def _outcome_of_stopped(
        self, key: str, run: StepRun, output: Any, error: ErrorInfo | None
    ) -> bool:
        """The outcome of visit ``key``, stopped while it ran (its task went on all the same),
        or of a step that ended before (False: nothing changes)."""
        if key in self.record.awaiting:
            return self._late_outcome(key, run, output, error)
        if run.status not in ("cancelled", "timed_out"):
            return False
        if error is None:
            return self._undo_late(key, run, output)
        if run.status == "timed_out" and key in self.record.steps and self.spec.states is None:
            return False  # a graph's step timed out with on_timeout partial: its joins count it
        # Failed or refused: shown so, and nothing waits for it should the instance end badly
        # (a cancel waited for a replaced visit's outcome that had come, till its deadline).
        run.status, run.error, run.ended_ms = "failed", error, self.now
        return True

    def _late_outcome(self, key: str, run: StepRun, output: Any, error: ErrorInfo | None) -> bool:
        """The outcome of a stopped step the undoing waits for: done, it is undone first."""
        self.record.awaiting = [k for k in self.record.awaiting if k != key]
        if error is None:
            run.status, run.output, run.ended_ms = "completed", output, self.now
            self.record.completed_order.append(key)
            self.actions.append(Note("compensating_late_step", key))
        else:  # it failed after all, or was refused: nothing of it to undo
            run.error = error
            if run.status == "cancelled":  # shown as cancelled beside its own error, it read
                run.status, run.ended_ms = "failed", self.now  # as stopped, not as failed
        self._compensate_next()
        return True

    def _late_wait_over(self, key: str, visit: int) -> bool:
        """A stopped step's outcome did not come by its deadline: undo the others; should it
        complete later still, :meth:`_undo_late` undoes it then."""
        if key not in self.record.awaiting or self.record.run_of(key).visit != visit:
            return False
        self.record.awaiting = [k for k in self.record.awaiting if k != key]
        self.actions.append(Note("compensating", key, {"undo": self._to_undo(), "gave_up": key}))
        self._compensate_next()
        return True

    def _undo_late(self, key: str, run: StepRun, output: Any) -> bool:
        """A step the instance stopped while it ran (cancelled, timed out, or a branch its
        join went on without) ended with a result after all, once the instance had ended
        or was ending: its effect happened, so with ``on_failure: compensate`` it is undone,
        without changing how the instance ended. One that ended badly undoes it like the
        steps completed before (last); a completed one, or a graph still running (a branch
        its join went on without), undoes that step alone at once. A state machine still
        running keeps it as done (its next states decide what becomes of that effect): it is
        undone with the others should the instance end badly (it was lost). False when there
        is nothing to undo."""
        if self.spec.on_failure != "compensate" or not self.spec.compensation_of(step_of(key)):
            return False
        if key in self.record.compensations:
            return False
        run.status, run.output, run.error, run.ended_ms = "completed", output, None, self.now
        self.record.completed_order.append(key)
        if self.record.status == "running" and self.spec.states is not None:
            return True  # done, and undone should the instance end badly: its states go on
        self.actions.append(Note("compensating_late_step", key))
        if self.record.status in ("completed", "running"):
            self._dispatch_undo(key)
            return True
        self.record.status = "compensating"
        self._compensate_next()
        return True


def _with_undo_failed(error: ErrorInfo | None, keys: list[str]) -> ErrorInfo:
    """The workflow's error, saying which undos failed (their effects stand; each has an open
    dead letter of its own)."""
    said = (
        f"undoing {', '.join(repr(k) for k in keys)} failed: their effects stand (their"
        " undo letters are open: reach dlq list --open)"
    )
    if error is None:
        return ErrorInfo(type="failed", message=said, retryable=False)
    return msgspec.structs.replace(error, message=f"{error.message}; {said}")
