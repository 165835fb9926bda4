"""The dashboard's timeline of a message: each stage's note is what `reach trace` prints."""

from __future__ import annotations

from agentreach.agents.letters import replay, resolve
from agentreach.broker.lifecycle import emit, event_for
from agentreach.dashboard.trace import trace_of
from agentreach.envelopes import Task, encode
from tests.support import eventually, letter_of


async def test_a_settled_letter_s_stages_say_who_settled_it_and_how(broker, watcher):
    """A letter replayed and then resolved: the replayed stage names the new message, its
    topic and who replayed it; the resolved one the note and who wrote it."""
    task = Task(v=1, message_id="timeline-1", trace_id="timeline-1", topic="chores")
    letter = await letter_of(broker, task)
    sent = await replay(broker, letter, sender="ops-worker")
    await resolve(broker, letter, "refunded by hand", by="alice")
    await eventually(lambda: watcher.count("resolved", {"timeline-1"}) == 1)
    trace = await trace_of(broker, "timeline-1")
    assert trace is not None
    [message] = [m for m in trace["messages"] if m["message_id"] == "timeline-1"]
    notes = {stage["event"]: stage["note"] for stage in message["stages"]}
    assert notes["replayed"] == f"as {sent.message_id} on 'chores', replay 1, by ops-worker"
    assert notes["resolved"] == "note 'refunded by hand', by alice"
    assert notes["dead_lettered"].startswith("reason no_route")


async def test_the_timeline_shows_no_event_an_agent_forged(broker, watcher):
    """An agent's `completed` of a message nobody routed to it showed the message completed
    with its result, and its `dead_lettered` body on a subject of its own ended another's."""
    task = Task(v=1, message_id="timeline-2", trace_id="timeline-2", topic="chores")
    await emit(broker, event_for(task, "routed", agent_id="worker-x"))
    forged = event_for(task, "completed", agent_id="mallory", result={"forged": True})
    await emit(broker, forged, sender="mallory")
    ending = event_for(task, "dead_lettered", agent_id="mallory", reason="poison")
    subject = broker.names.event("failed", "chores", "timeline-2", "timeline-2", "mallory")
    await broker.publish(subject, encode(ending))
    await emit(broker, event_for(task, "accepted", agent_id="worker-x"), sender="worker-x")
    await eventually(lambda: watcher.count("accepted", {"timeline-2"}) == 1)
    trace = await trace_of(broker, "timeline-2")
    assert trace is not None
    [message] = trace["messages"]
    assert [s["event"] for s in message["stages"]] == ["routed", "accepted"]
    assert message["status"] == "in_flight"
