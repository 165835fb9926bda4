"""Who an event comes from: its sender token, checked against what its body claims."""

from __future__ import annotations

import msgspec

from agentreach import envelopes
from agentreach.broker import read_stream
from agentreach.broker.lifecycle import COORDINATOR, about, emit, event_for
from agentreach.coordinator.protection.grants import step_routed_to, vouched_sender
from agentreach.envelopes import Result, Task

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


async def test_a_step_result_is_vouched_for_only_by_the_coordinators_routing_of_a_step(broker):
    """An agent's result to a workflow counts when the coordinator routed that attempt of
    the step to it; neither a ``routed`` body an agent published on a subject of its own,
    nor the routing of the agent's own task of the same message id, vouches for it."""
    names = broker.names
    step = Task(v=1, message_id="inst-a-1", trace_id="t-wf", topic="echo")
    result = Result(**about(step, result="r"))
    forged = event_for(step, "routed", agent_id="worker-y")
    await broker.publish(
        names.event("accepted", "echo", "t-wf", "inst-a-1", "worker-y"), envelopes.encode(forged)
    )
    own_task = msgspec.structs.replace(step, trace_id="t-own", caller="worker-y")
    await emit(broker, event_for(own_task, "routed", agent_id="worker-y"))
    own_result = Result(**about(own_task, result="r"))
    assert not await step_routed_to(broker, result, "worker-y")
    assert not await step_routed_to(broker, own_result, "worker-y")
    await emit(broker, event_for(step, "routed", agent_id="worker-x"))
    assert await step_routed_to(broker, result, "worker-x")
    assert not await step_routed_to(broker, result, "worker-y")
    retried = msgspec.structs.replace(result, attempt=2)
    assert not await step_routed_to(broker, retried, "worker-x")
