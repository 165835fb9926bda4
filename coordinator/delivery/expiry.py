"""A task that expired in an agent's queue ends once, whoever finds it first.

Two parties may find the same dispatch past its ttl: its agent, which reports ``expired``
when it fetches the task (or when its wait for a place runs out), and the coordinator's
sweep of the queues, which ends what the agent does not take (its consumers gone, its
fetch loop stuck). Each ends the task with a dead letter and an error to its sender, so
they must not both do it. The tie-break is one conditional write, the *expiry fence*: the
agent's execution record of that attempt, rewritten as ``failed`` with the ``expired``
error that ends the task. Whoever writes it ends the task; whoever finds another's fence
there leaves the task alone. Finding one's own (the same error: a crash between the write
and the ending, a redelivered report) ends it again, and the dead letter's id drops the
copy. A run's claim is never written over: a task an agent runs is not expired.

To an agent a fence is a ``failed`` record like any other (``lease_until_ms`` 0,
``finished_at_ms`` set): it checks the ttl before it claims, so it takes no fenced task,
and the sealed copy of the dispatch's ``Reach-Seal`` keeps the record believed on a
secured deployment.
"""

from __future__ import annotations

from typing import Literal

import structlog

from agentreach.broker import Broker
from agentreach.coordinator.routing.run_once import lease_limit
from agentreach.envelopes import (
    ErrorInfo,
    Execution,
    Task,
    execution_key,
    is_expiry_fence,
    now_ms,
)

log = structlog.get_logger("coordinator.expiry")

EXPIRED = "expired"  # the error type, and the dead letter's reason

Fenced = Literal["end", "ended", "running"]


async def fence_expiry(
    broker: Broker,
    task: Task,
    agent_id: str,
    error: ErrorInfo,
    *,
    seal: str | None,
    ttl_end_ms: int | None = None,
) -> Fenced:
    """Write the expiry fence of ``task``'s attempt into ``agent_id``'s record. ``end``: the
    caller ends the task (it wrote the fence, or this very fence stood already); ``ended``:
    another party's fence stands, or the task ran (``done``), so nothing is to be ended;
    ``running``: a run holds a live claim of the attempt (or a later one)."""
    executions = await broker.bucket(broker.names.executions_bucket, Execution)
    key = execution_key(task.caller, task.message_id, agent_id)
    found: list[Fenced] = []

    def fence(record: Execution | None) -> Execution | None:
        found.clear()
        if record is not None and (why := _standing(record, task, error, ttl_end_ms)) is not None:
            found.append(why)
            return None
        return Execution(
            message_id=task.message_id,
            state="failed",
            agent_id=agent_id,
            epoch=record.epoch if record is not None else 0,
            attempt=task.attempt,
            error=error,
            finished_at_ms=now_ms(),
            caller=task.caller,
            seal=seal,
        )

    swap = await executions.cas(key, fence)
    return "end" if swap.written else found[0]


def _standing(
    record: Execution, task: Task, error: ErrorInfo, ttl_end_ms: int | None
) -> Fenced | None:
    """What ``record`` says that a fence must not replace; None when it may be replaced."""
    if record.state == "done":
        return "ended"  # it ran: its result answers (the caller's look at the records does)
    # As every look at a lease counts it:
    limit_ms = lease_limit(task, ttl_end_ms) or record.lease_until_ms
    if record.state == "running" and (
        record.attempt > task.attempt or min(record.lease_until_ms, limit_ms) > now_ms()
    ):
        return "running"
    if is_expiry_fence(record, task.attempt):
        return "end" if record.error == error else "ended"
    return None
