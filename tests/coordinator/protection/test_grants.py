"""Who an event comes from: its sender token, checked against what its body claims."""

from __future__ import annotations

from agentreach.broker import read_stream
from agentreach.broker.lifecycle import COORDINATOR, event_for
from agentreach.coordinator.protection.grants import vouched_sender
from agentreach.envelopes import Task

TASK = Task(v=1, message_id="m-1", trace_id="t-1", topic="echo")


async def _alerts(broker) -> list[bytes]:  # type: ignore[no-untyped-def]
    stored = await read_stream(broker, broker.names.events_stream, broker.names.events_wildcard)
    return [m.data for m in stored if ".alert." in m.subject]


async def test_an_agent_naming_itself_is_vouched_for(broker):
    event = event_for(TASK, "completed", agent_id="worker-x")
    subject = broker.names.event("completed", "echo", "t-1", "m-1", "worker-x")
    assert await vouched_sender(broker, subject, event) == "worker-x"
    assert await _alerts(broker) == []


async def test_the_coordinators_own_events_name_any_agent_or_none(broker):
    """A person's answer is a ``completed`` from the coordinator naming no agent: it used to
    raise an impersonation alert every time."""
    answered = event_for(TASK, "completed")
    subject = broker.names.event("completed", "echo", "t-1", "m-1", COORDINATOR)
    assert await vouched_sender(broker, subject, answered) == COORDINATOR
    assert await _alerts(broker) == []


async def test_a_body_naming_another_agent_is_an_alert(broker):
    forged = event_for(TASK, "completed", agent_id="worker-x")
    subject = broker.names.event("completed", "echo", "t-1", "m-1", "worker-y")
    assert await vouched_sender(broker, subject, forged) is None
    [alert] = await _alerts(broker)
    assert b"impersonation" in alert and b"worker-y" in alert and b"worker-x" in alert
