"""The dashboard's timeline of a message: each stage's note is what `reach trace` prints."""

from __future__ import annotations

import asyncio
from collections import Counter

from agentreach.agents import ReachClient
from agentreach.agents.letters import replay, resolve
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.delivery.unrouted import unrouted
from agentreach.dashboard.trace import trace_of
from agentreach.envelopes import Task, encode
from tests.cli.test_reach_cli import reach
from tests.e2e.routing_support import serving, worker
from tests.support import eventually, letter_of, until_true


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


async def test_the_time_a_task_waited_in_the_intake_is_its_first_stage(
    broker, coordinator, watcher
):
    """A task held for want of an agent: its timeline began at `routed`, its total hid the
    wait (3 s shown of 150 s, in a walkthrough), and `reach trace` began there too. Both now
    begin when the intake stored it."""
    async with ReachClient(broker=broker) as client:
        async with serving(broker, coordinator, worker("late-1", Counter(), topics=["later"])):
            pass  # its card stays, stopped: a task of its topic waits for it
        message_id, _ = await client.publish("later", {}, ttl_ms=60_000)
        await until_true(lambda: unrouted(broker, message_id))  # held: nobody serves it
        await asyncio.sleep(0.5)  # a wait the trace must show (no event marks it)
        async with serving(broker, coordinator, worker("late-1", Counter(), topics=["later"])):
            await watcher.event("completed", message_id=message_id)
    trace = await trace_of(broker, message_id)
    traced = await reach(broker, "trace", message_id)
    assert trace is not None
    [message] = trace["messages"]
    received, routed = message["stages"][0], message["stages"][1]
    assert (received["event"], routed["event"]) == ("received", "routed")
    assert message["started_ms"] == received["at_ms"]
    assert routed["offset_ms"] >= 500
    lines = traced.stdout.splitlines()
    assert lines[2].split()[2] == "received" and lines[3].split()[2] == "routed"
