"""The dashboard's timeline of a message: each stage's note is what `reach trace` prints."""

from __future__ import annotations

from agentreach.agents.letters import replay, resolve
from agentreach.dashboard.trace import trace_of
from agentreach.envelopes import Task
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
