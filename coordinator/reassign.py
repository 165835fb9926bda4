"""An agent went OFFLINE: its unfinished tasks go to another agent, fenced from the old one.

What was dispatched to it and not acknowledged is still in its dispatch
subjects (work-queue streams keep a message until it is acknowledged). Each is
dispatched again with the same message_id and attempt + 1. Before that, its
execution record is marked failed: a late ``finish`` from the old agent then
loses the conditional write, and its result is rejected instead of sent.
"""

from __future__ import annotations

import contextlib

import msgspec
import nats.errors
import nats.js.errors
import structlog
from agentreach.broker import Broker
from agentreach.broker.lifecycle import now_ms
from agentreach.envelopes import DecodeError, ErrorInfo, Execution, Task
from agentreach.envelopes.headers import task_headers

from agentreach import envelopes

log = structlog.get_logger("coordinator.reassign")

_execution = msgspec.json.Decoder(Execution)


async def reassign_tasks(broker: Broker, agent_id: str) -> int:
    """Re-dispatch every task waiting for ``agent_id``; returns how many."""
    moved = 0
    for priority, stream in broker.names.dispatch_streams.items():
        subject = broker.names.dispatch(agent_id, priority)
        seq = 1
        while True:
            try:
                stored = await broker.js.get_msg(stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            seq = (stored.seq or seq) + 1
            if await _move(broker, stored.data or b"", stored.time):
                moved += 1
            await broker.js.delete_msg(stream, stored.seq or 0)
    if moved:
        log.info("tasks reassigned", agent_id=agent_id, count=moved)
    return moved


async def _move(broker: Broker, data: bytes, dispatched: object) -> bool:
    """Send the task through intake again as its next attempt, with the ttl it has left.

    Intake, not the router directly: when no agent can take it now it waits there,
    on the broker, instead of being lost with this call.
    """
    try:
        task = envelopes.decode_task(data)
    except DecodeError:
        return False  # the agent's consumer would have dead-lettered it; nothing to move
    await _fence(broker, task)
    dispatched_ms = int(dispatched.timestamp() * 1000) if dispatched else now_ms()  # type: ignore[attr-defined]
    left_ms = task.ttl_ms - max(0, now_ms() - dispatched_ms)
    retry = msgspec.structs.replace(
        task, attempt=task.attempt + 1, to_agent=None, ttl_ms=max(1, left_ms)
    )
    headers = task_headers(retry, msg_id=f"{task.message_id}-{retry.attempt}")
    await broker.publish(broker.names.task(task.topic), envelopes.encode(retry), headers=headers)
    return True


async def _fence(broker: Broker, task: Task) -> None:
    """Take a running claim away from the old agent, so its late result cannot land."""
    kv = await broker.kv(broker.names.executions_bucket)
    try:
        entry = await kv.get(task.message_id)
        record = _execution.decode(entry.value or b"")
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, msgspec.DecodeError):
        return
    if record.state != "running":
        return
    fenced = msgspec.structs.replace(
        record,
        state="failed",
        error=ErrorInfo(type="reassigned", message="its agent went OFFLINE", retryable=True),
    )
    # Losing this race means it finished just now: the next attempt finds the stored result.
    with contextlib.suppress(nats.errors.Error):
        await kv.update(task.message_id, envelopes.encode(fenced), last=entry.revision)
