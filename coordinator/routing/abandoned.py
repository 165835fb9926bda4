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
(:mod:`.manual`): its item is withdrawn, and an answer refused.
"""

from __future__ import annotations

from agentreach.broker import Broker
from agentreach.coordinator.delivery.dead_letters import refuse
from agentreach.envelopes import ErrorInfo, Task, WorkflowRecord
from agentreach.envelopes.coordination import step_abandoned, workflow_step_of


async def abandoned(broker: Broker, task: Task) -> str | None:
    """Why ``task``, a visit of a workflow's step, is no longer wanted; None when it is (or
    when it is no step)."""
    instance_id = broker.names.workflow_of(task.reply_to)
    step = workflow_step_of(instance_id, task)
    if instance_id is None or step is None:
        return None
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    entry = await records.get(instance_id)
    return step_abandoned(entry.value if entry else None, step, task.message_id)


async def refused_as_abandoned(broker: Broker, task: Task) -> bool:
    """Refuse ``task`` as ``cancelled`` when :func:`abandoned` says why; whether it did."""
    if (why := await abandoned(broker, task)) is None:
        return False
    error = ErrorInfo(type="cancelled", message=f"not dispatched: {why}", retryable=False)
    await refuse(broker, task, error)
    return True
