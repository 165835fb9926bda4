"""A workflow step's task that its instance no longer waits for is not dispatched.

A step's task waits in intake while no agent can take it, and a failed attempt is routed
again after its backoff: meanwhile the instance may have been cancelled or have ended, or
the step been stopped (it timed out, or a signal moved its state machine on). Its work
would then run for nothing, its side effects after an operator's cancel ("a cancel
dispatches no further step"). So before a step's task is dispatched, first or again, the
instance's record is read, and unless that visit of the step still runs there the task is
refused as ``cancelled``: a ``rejected`` event and an error to the instance, which no
longer waits for it; no dead letter, since nothing failed. A task that is no step is not
read for. The same question keeps such a task from waiting for a person
(:mod:`.manual`): its item is withdrawn, and an answer refused. A visit still wanted may
run only until its step's deadline, however late it is sent (:func:`still_wanted`).
"""

from __future__ import annotations

import msgspec
import structlog

from agentreach.broker import Broker
from agentreach.coordinator.delivery.dead_letters import refuse
from agentreach.envelopes import DecodeError, ErrorInfo, Task, WorkflowRecord, now_ms
from agentreach.envelopes.coordination import WorkflowStep, step_abandoned, workflow_step_of

log = structlog.get_logger("coordinator.abandoned")


class _Unreadable(Exception):
    """The instance's record holds what no replica wrote (anyone may have the server write
    its answer onto a key): the engine goes on from its own copy, so the visit is wanted."""


async def abandoned(broker: Broker, task: Task) -> str | None:
    """Why ``task``, a visit of a workflow's step, is no longer wanted; None when it is (or
    when it is no step)."""
    step = _step_of(broker, task)
    if step is None:
        return None
    try:
        return step_abandoned(await _confirmed(broker, step, task), step, task.message_id)
    except _Unreadable:
        return None


async def still_wanted(broker: Broker, task: Task) -> Task | None:
    """``task`` as it may be dispatched now, or None once refused as ``cancelled`` (a visit
    its workflow no longer waits for).

    A step's visit may not run past the step's deadline (its ``timeout_s``, else its
    instance's): sent again after a retry's backoff, from an agent that died, or after a
    wait in intake, it gets what is left of that deadline as its execute budget. With a
    fresh budget it could complete after its instance stopped waiting for it and undid the
    steps before it, an effect nothing would record (a step with no undo). An undo step runs
    after the deadline by design: its budget is left as it is."""
    step = _step_of(broker, task)
    if step is None:
        return task
    try:
        record = await _confirmed(broker, step, task)
    except _Unreadable:
        return task
    if (why := step_abandoned(record, step, task.message_id)) is not None:
        error = ErrorInfo(type="cancelled", message=f"not dispatched: {why}", retryable=False)
        await refuse(broker, task, error)
        return None
    if record is None or step.compensation:
        return task
    ends_ms = record.steps[step.step].deadline_ms or record.deadline_ms
    left_ms = max(1, ends_ms - now_ms())
    if left_ms >= task.budget.execute_ms:
        return task
    return msgspec.structs.replace(
        task, budget=msgspec.structs.replace(task.budget, execute_ms=left_ms)
    )


def _step_of(broker: Broker, task: Task) -> WorkflowStep | None:
    return workflow_step_of(broker.names.workflow_of(task.reply_to), task)


async def _confirmed(broker: Broker, step: WorkflowStep, task: Task) -> WorkflowRecord | None:
    """The instance's record; read again from the stream's leader when it says the visit is
    not wanted: a replica behind (a node paused) showed a visit not begun, and a wanted
    step was refused."""
    record = await _record(broker, step)
    if step_abandoned(record, step, task.message_id) is None:
        return record
    return await _record(broker, step, leader=True)


async def _record(
    broker: Broker, step: WorkflowStep, *, leader: bool = False
) -> WorkflowRecord | None:
    """The instance's record; ``leader``: as the stream's leader has it."""
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    try:
        entry = await records.get(step.instance_id, leader=leader)
    except DecodeError as exc:
        log.warning("workflow record unreadable: its step's visit is dispatched", error=str(exc))
        raise _Unreadable from exc
    return entry.value if entry else None
