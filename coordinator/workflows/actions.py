"""What moving a workflow instance on asks the engine to do: dispatch a step's task, arm a
timer, publish a note, let a step go, announce the end. Each is idempotent, so repeating them
after a crash is safe: a step's message id derives from the instance, the step and the visit.
(A step's task sent again is dropped as a copy only while the server remembers its id: see
``Dispatch.unless_routed``.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from agentreach.envelopes import StepRun, WorkflowRecord
from agentreach.envelopes.audit import summary_of_task
from agentreach.envelopes.coordination import step_message_id


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send ``run`` as a task (reply to the workflow's reply subject). ``unless_routed``:
    not when it was routed already (its ``routed`` event is stored; from there the delivery
    owns it, reassignment included): a resumed instance's step. The server forgets the ids
    of consumed messages when it is killed, so a step routed before a kill -9 and sent again
    after it ran twice (a chaos run: a coordinator that started just after the kill resumed
    it, and the agent it was first routed to, disconnected meanwhile, ran it when back)."""

    key: str
    run: StepRun
    unless_routed: bool = False


@dataclass(frozen=True, slots=True)
class Timer:
    key: str
    visit: int
    due_ms: int


@dataclass(frozen=True, slots=True)
class Note:
    """An event to publish: about the workflow (``key`` "") or one step's visit."""

    event: str
    key: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    # Published only when not published before: an instance's ending repeated after a
    # crash, maybe past the events' duplicate window (its metrics would count it twice).
    unless_sent: bool = False


@dataclass(frozen=True, slots=True)
class Abandon:
    """A running step the instance no longer waits for (cancelled, timed out, or the
    instance ended): a step that is another workflow is cancelled in turn, so that it
    dispatches nothing more; an agent's task is not interrupted."""

    key: str
    run: StepRun


@dataclass(frozen=True, slots=True)
class Finish:
    """The workflow ended (completed, failed or cancelled): answer its starter (and
    dead-letter a failed one). ``again``: repeated for a record found ended, and skipped
    once its ending's event is stored (published after the answer): every message of an
    ended instance delivered again after a crash answered and dead-lettered it again (a
    drill: 86 times)."""

    again: bool = False


Action = Dispatch | Timer | Note | Abandon | Finish


def started(record: WorkflowRecord) -> Note:
    """The event of the instance's start, with a summary of its input (``input``, as a
    task's ``routed`` has): the starting id sent again with another payload is told apart."""
    summary = msgspec.to_builtins(summary_of_task(record.task))
    return Note("workflow_started", detail={"input": summary})


def ending(record: WorkflowRecord, *, again: bool = False) -> Note:
    """The event of how ``record``'s instance ended, with what its starter is told: the
    result (and a state machine's path), or the error, the steps that ran and those whose
    undo failed. ``again``: repeated for a record found ended (the first may be lost)."""
    detail: dict[str, Any]
    if record.status == "completed":
        detail = {"result": record.result}
        if record.path:
            detail["path"] = record.path
    else:
        detail = {"ran": record.steps_began}
        failed = [k for k, run in record.compensations.items() if run.status == "failed"]
        if failed:
            detail["undo_failed"] = failed
        detail["error"] = msgspec.to_builtins(record.error)
    return Note(f"workflow_{record.status}", detail=detail, unless_sent=again)


# A step visit's message id, derived so that a repeated dispatch is a duplicate; the envelopes
# read it back to name the step of a dead letter (``DeadLetter.workflow``).
message_id_of = step_message_id
