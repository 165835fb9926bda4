"""Acting on workflow instances from outside the coordinator: read, cancel, signal."""

from __future__ import annotations

from agentreach.broker import Broker
from agentreach.envelopes import WorkflowRecord


async def read_record(broker: Broker, instance_id: str) -> WorkflowRecord | None:
    """The instance's record in ``reach_workflows``, or None when there is none."""
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    entry = await records.get(instance_id)
    return entry.value if entry else None


async def all_records(broker: Broker) -> list[WorkflowRecord]:
    """Every instance in ``reach_workflows``, newest first."""
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    found = [entry.value for entry in (await records.snapshot()).values()]
    return sorted(found, key=lambda r: r.started_ms, reverse=True)


async def cancel(broker: Broker, instance_id: str, *, why: str = "") -> None:
    """Ask the coordinator (any replica) to cancel ``instance_id``; ``why`` becomes the
    message of its error (by default, that an operator cancelled it)."""
    await broker.publish(broker.names.workflow_cancel(instance_id), why.encode())


async def signal(broker: Broker, instance_id: str, event: str) -> None:
    """Send ``event`` to a state machine instance waiting for it."""
    await broker.publish(broker.names.workflow_signal(instance_id, event), b"")
