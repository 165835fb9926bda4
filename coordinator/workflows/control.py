"""Acting on workflow instances from outside the coordinator: read, cancel, signal."""

from __future__ import annotations

import asyncio

from agentreach.broker import Broker
from agentreach.envelopes import WorkflowRecord
from agentreach.envelopes import headers as h


async def read_record(
    broker: Broker, instance_id: str, *, within_s: float = 0.0
) -> WorkflowRecord | None:
    """The instance's record in ``reach_workflows``, or None when there is none (still none
    after ``within_s``: a signal or a cancel sent just after the start, which may still
    wait in the intake)."""
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    deadline = asyncio.get_running_loop().time() + within_s
    while (entry := await records.get(instance_id)) is None:
        if asyncio.get_running_loop().time() >= deadline:
            return None
        await asyncio.sleep(RECORD_POLL_S)
    return entry.value


RECORD_POLL_S = 0.2


async def all_records(broker: Broker) -> list[WorkflowRecord]:
    """Every instance in ``reach_workflows``, newest first."""
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    found = [entry.value for entry in (await records.snapshot()).values()]
    return sorted(found, key=lambda r: r.started_ms, reverse=True)


async def cancel(
    broker: Broker, instance_id: str, *, why: str = "", caller: str | None = None
) -> None:
    """Ask the coordinator (any replica) to cancel ``instance_id``; ``why`` becomes the
    message of its error (by default, that an operator, or ``caller``, cancelled it).

    An operator asks on ``reach.wf.cancel.<instance>``; a caller on
    ``reach.wf.cancel.<instance>.<caller>``, the only form its permissions allow, and the
    coordinator cancels only an instance that caller started."""
    subject = broker.names.workflow_cancel(instance_id)
    if caller is not None:
        subject = f"{subject}.{caller}"
    await broker.publish(subject, why.encode(), headers=h.control_headers("cancel"))


async def signal(broker: Broker, instance_id: str, event: str) -> int:
    """Send ``event`` to a state machine instance waiting for it; the sequence it was stored
    at, which the coordinator's answer (``signal_taken`` / ``signal_ignored``) names."""
    sent = await broker.publish(
        broker.names.workflow_signal(instance_id, event), b"", headers=h.control_headers("signal")
    )
    return sent.seq
