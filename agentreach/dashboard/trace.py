"""A message's (or a trace's) stages as the dashboard draws them on a timeline."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from agentreach.broker import Broker, read_stream
from agentreach.broker.lifecycle import authentic
from agentreach.coordinator.delivery.unrouted import unrouted, why_unrouted
from agentreach.envelopes import Event
from agentreach.envelopes.described import described

MAX_MESSAGES = 50
# The events that end a message (a workflow instance is one too), and the status they give.
ENDINGS = {
    "completed": "completed",
    "answered_from_record": "completed",
    "dead_lettered": "dead_lettered",
    "workflow_completed": "completed",
    "workflow_failed": "dead_lettered",  # its dead letter (workflow_failed) follows
    "workflow_cancelled": "cancelled",
}


async def trace_of(broker: Broker, some_id: str) -> dict[str, Any] | None:
    """The stages of message ``some_id``, or else of every message of trace ``some_id``;
    of a workflow instance, those of its steps too (they share its trace)."""
    names = broker.names
    events = await _events(broker, names.events_of_message(some_id))
    if any(event.event == "workflow_started" for _, event in events):
        events = await _events(broker, names.events_of_trace(events[0][1].trace_id))
    if not events:
        events = await _events(broker, names.events_of_trace(some_id))
    if not events:
        return None
    by_message: dict[str, list[tuple[float, Event]]] = {}
    for at, event in events:
        if event.message_id in by_message or len(by_message) < MAX_MESSAGES:
            by_message.setdefault(event.message_id, []).append((at, event))
    messages = [_message(message_id, own) for message_id, own in by_message.items()]
    messages.sort(key=lambda m: m["started_ms"])
    return {"query": some_id, "trace_id": events[0][1].trace_id, "messages": messages}


async def waiting_in_intake(
    broker: Broker, some_id: str, *, coordinator_runs: bool = True
) -> dict[str, Any] | None:
    """No event of ``some_id`` is recorded: its tasks stored in the intake and not routed
    yet (held for want of an agent, or not reached), as messages of one stage, `received`;
    None when there are none either. `reach trace` says the same of them."""
    waiting = await unrouted(broker, some_id)
    if not waiting:
        return None
    messages = [
        {
            "message_id": task.message_id,
            "topic": task.topic,
            "priority": task.priority,
            "status": "waiting",
            "reason": None,
            "started_ms": task.stored_ms,
            "ended_ms": None,
            "stages": [
                {
                    "event": "received",
                    "at_ms": task.stored_ms,
                    "offset_ms": 0.0,
                    "attempt": 1,
                    "agent_id": None,
                    "note": "stored by the intake, not routed yet: "
                    + why_unrouted(task, coordinator_runs=coordinator_runs),
                }
            ],
        }
        for task in waiting[:MAX_MESSAGES]
    ]
    return {"query": some_id, "trace_id": waiting[0].trace_id, "messages": messages}


async def _events(broker: Broker, subject: str) -> list[tuple[float, Event]]:
    """The authentic events stored on ``subject`` (as `reach trace` shows them: an agent's
    forged `completed` of a message nobody routed to it showed it completed), with their
    broker time (ms)."""
    stored = await read_stream(broker, broker.names.events_stream, subject)
    return [(m.timestamp_ns / 1e6, event) for m, event in authentic(broker.names, stored)]


def received_ms(events: Iterable[Event], first_ms: float) -> int | None:
    """When the intake stored the message, as its first event that says so echoes it, if
    before ``first_ms`` (its first event's time): a task held for want of an agent, or for
    room, waited there, and a trace from its first event hid that."""
    received = next((e.received_ms for e in events if e.received_ms), None)
    return received if received is not None and received < first_ms else None


def _message(message_id: str, own: list[tuple[float, Event]]) -> dict[str, Any]:
    first_at, first = own[0]
    if (received := received_ms((event for _, event in own), first_at)) is not None:
        intake = msgspec.structs.replace(first, event="received", agent_id=None, detail={})
        own = [(float(received), intake), *own]
        first_at = received
    status, reason, ended = "in_flight", None, None
    for at, event in own:
        if event.event in ENDINGS:
            status, ended = ENDINGS[event.event], at
            reason = event.detail.get("reason") if event.event == "dead_lettered" else None
    return {
        "message_id": message_id,
        "topic": first.topic,
        "priority": first.priority,
        "status": status,
        "reason": reason,
        "started_ms": first_at,
        "ended_ms": ended,
        "stages": [
            {
                "event": event.event,
                "at_ms": at,
                "offset_ms": round(at - first_at, 3),
                "attempt": event.attempt,
                "agent_id": event.agent_id,
                "note": described(event),
            }
            for at, event in own
        ],
    }
