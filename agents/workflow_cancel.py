"""Cancelling a workflow instance a caller started (:meth:`ReachClient.cancel_workflow`).

A caller may not read the workflow records, so it learns how its instance stands from the
instance's events, before and after the cancel, as ``reach trace`` does; the coordinator
cancels only an instance that caller started (caller.md §8.3)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentreach.agents.errors import DeadlineExceeded, UnknownWorkflow
from agentreach.broker import Broker
from agentreach.envelopes import Event

# How an instance's events say it ended.
ENDINGS = {
    "workflow_completed": "completed",
    "workflow_failed": "failed",
    "workflow_cancelled": "cancelled",
}
POLL_S = 0.2  # a caller's creds read events only through the coordinator: asked again


@dataclass(frozen=True, slots=True)
class WorkflowEnded:
    """How a workflow instance ended: ``status`` ``cancelled``, or ``completed`` / ``failed``
    when it ended otherwise; ``before_cancel``: it had ended before the cancel was sent
    (none was); ``at_ms``: when, on the coordinator's clock."""

    instance_id: str
    status: str
    at_ms: int
    before_cancel: bool


async def cancel_workflow(
    broker: Broker,
    caller: str,
    events_of: Callable[[str], Awaitable[list[Event]]],
    instance_id: str,
    *,
    why: str,
    wait_s: float,
) -> WorkflowEnded:
    """Cancel ``instance_id`` as ``caller`` and wait up to ``wait_s`` for it to end;
    ``events_of`` reads a message's events (the caller's own)."""

    async def own_events() -> list[Event]:
        return [e for e in await events_of(instance_id) if e.message_id == instance_id]

    events = await own_events()
    started = next((e for e in events if e.event == "workflow_started"), None)
    # On an open server the events of every caller's instances can be read: another's is
    # refused here as the coordinator would (it logs that and says nothing).
    if started is None or started.caller not in (None, caller):
        raise UnknownWorkflow(
            f"no workflow instance {instance_id!r} among {caller}'s own messages (a caller"
            " cancels only the instances it started)"
        )
    if (ended := _ended(instance_id, events, before_cancel=True)) is not None:
        return ended
    await broker.publish(f"{broker.names.workflow_cancel(instance_id)}.{caller}", why.encode())
    deadline = asyncio.get_running_loop().time() + wait_s
    while (ended := _ended(instance_id, events, before_cancel=False)) is None:
        if asyncio.get_running_loop().time() >= deadline:
            raise DeadlineExceeded(
                f"workflow {instance_id!r}: cancel sent; not ended within {wait_s:g} s (its"
                " steps' undoing may still run)",
                message_id=instance_id,
                trace_id=started.trace_id,
            )
        await asyncio.sleep(POLL_S)
        events = await own_events()
    return ended


def _ended(instance_id: str, events: list[Event], *, before_cancel: bool) -> WorkflowEnded | None:
    ending = next((e for e in events if e.event in ENDINGS), None)
    if ending is None:
        return None
    return WorkflowEnded(instance_id, ENDINGS[ending.event], ending.at_ms, before_cancel)
