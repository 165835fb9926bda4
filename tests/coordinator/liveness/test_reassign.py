"""Reassigning the tasks of an agent that went OFFLINE, on a real server."""

from __future__ import annotations

import asyncio

from agentreach import envelopes
from agentreach.coordinator.liveness.reassign import reassign_tasks
from agentreach.envelopes import Execution, execution_key


async def _queued(broker, message_id: str, agent_id: str) -> envelopes.Task:  # type: ignore[no-untyped-def]
    """A task past its ttl of 200 ms, still in ``agent_id``'s dispatch stream."""
    task = envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic="slow", ttl_ms=200, to_agent=agent_id
    )
    await broker.publish(broker.names.dispatch(agent_id, "P1"), envelopes.encode(task))
    await asyncio.sleep(0.25)  # the passing of the ttl is what these tests are about
    return task


async def test_a_task_past_its_ttl_in_a_gone_agents_queue_is_dead_lettered_as_expired(
    broker, watcher
):
    await _queued(broker, "stale-q-1", "gone-1")
    assert await reassign_tasks(broker, "gone-1") == 1
    letter = await watcher.dead_letter("expired", message_id="stale-q-1")
    assert letter.error is not None and "gone-1, which went OFFLINE" in letter.error.message


async def test_a_task_the_gone_agent_finished_is_answered_from_its_record_not_expired(
    broker, watcher
):
    """The agent ran it and recorded its result, but its acknowledgement was lost (a server
    failing over), so the task was still queued when the agent went: it is answered from
    that record, not dead-lettered as expired."""
    await _queued(broker, "done-q-1", "gone-2")
    records = await broker.bucket(broker.names.executions_bucket, Execution)
    done = Execution(
        message_id="done-q-1",
        state="done",
        agent_id="gone-2",
        finished_at_ms=envelopes.now_ms(),
        result={"ok": True},
    )
    await records.create(execution_key(None, "done-q-1", "gone-2"), done)
    assert await reassign_tasks(broker, "gone-2") == 1
    answered = await watcher.event("answered_from_record", message_id="done-q-1")
    assert answered.agent_id == "gone-2"
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "done-q-1"]
