"""A workflow instance's deadline: the earlier of its definition's ``ttl_s`` (from its start)
and the ttl of the task that started it (from the broker's receipt of that task).

The README promises that a task past its ttl is never executed, and a workflow's steps are
parts of its starting task: so no step is dispatched past the deadline, a step's own ttl is
at most what is left of it, and a child workflow (a step's task) ends by its parent's.
"""

from __future__ import annotations

from typing import Any

from agentreach.coordinator.workflows.definitions import as_stored, fingerprint
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, Task, WorkflowRecord, ttl_left_ms


def deadline_of(task: Task, spec: WorkflowSpec, now_ms: int) -> int:
    """When the instance ``task`` starts at ``now_ms`` ends, done or not."""
    ttl_ms = ttl_left_ms(task.ttl_ms, task.received_ms or now_ms, now_ms)
    return now_ms + min(int(spec.ttl_s * 1000), ttl_ms)


def expiry(record: WorkflowRecord, spec: WorkflowSpec) -> ErrorInfo:
    """The error an instance past its deadline ends with, naming the ttl that passed."""
    if record.deadline_ms < record.started_ms + int(spec.ttl_s * 1000):
        why = f"the ttl {record.task.ttl_ms} ms of the task that started it passed"
    else:
        why = f"workflow ttl {spec.ttl_s:g} s passed"
    return ErrorInfo(type="expired", message=why, retryable=False)


def new_record(
    workflow: str,
    task: Task,
    spec: WorkflowSpec,
    now_ms: int,
    calls: dict[str, dict[str, Any]] | None = None,
) -> WorkflowRecord:
    """The record of an instance of ``spec`` that ``task`` starts at ``now_ms``; ``calls``:
    the definitions of the workflows it starts as children (and theirs)."""
    return WorkflowRecord(
        instance_id=task.message_id,
        workflow=workflow,
        trace_id=task.trace_id,
        task=task,
        started_ms=now_ms,
        deadline_ms=deadline_of(task, spec, now_ms),
        definition_id=fingerprint(spec),
        definition=as_stored(spec),
        calls=calls if calls is not None else {},
        steps_total=0 if spec.is_machine else len(spec.graph()),
    )
