"""Replies and traces through a real server: a workflow is sent only what its engine reads,
and a trace shows only events that are what their subjects say."""

from __future__ import annotations

import asyncio

from agentreach import envelopes
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import about, emit, event_for, reply, trace_of
from agentreach.envelopes import Ack, Capacity, Progress, Result, Task, new_id
from tests.support import until_true


def task_answering_to(reply_to: str) -> Task:
    message_id = new_id()
    return Task(v=1, message_id=message_id, trace_id=message_id, topic="echo", reply_to=reply_to)


def every_reply(task: Task) -> list[Ack | Progress | Result]:
    return [
        Ack(**about(task), capacity=Capacity(free_slots=1)),
        Progress(**about(task), note="half way"),
        Result(**about(task, result={"ok": True})),
    ]


async def test_a_workflow_is_sent_only_the_result(broker):
    """Acks and progress would each be stored in REACH_WORKFLOWS and handed to the engine,
    which reads only a step's result."""
    names = broker.names
    task = task_answering_to(names.workflow_reply("instance-1"))
    for message in every_reply(task):
        await reply(broker, task, message, sender="worker-1")
    subject = f"{task.reply_to}.worker-1"

    async def stored():  # type: ignore[no-untyped-def]
        return await messages_on(broker, names.workflows_stream, subject)

    await until_true(stored)  # replies go out in order: the result is the last one
    assert [m.headers.get("Reach-Kind") for m in await stored()] == ["result"]


async def test_a_caller_is_sent_every_reply(broker):
    names = broker.names
    task = task_answering_to(names.reply_box("alice", "box-1"))
    kinds: list[str] = []
    all_three = asyncio.Event()

    async def take(msg) -> None:  # type: ignore[no-untyped-def]
        kinds.append(msg.headers["Reach-Kind"])
        if len(kinds) == 3:
            all_three.set()

    await broker.nc.subscribe(f"{task.reply_to}.*", cb=take)
    await broker.nc.flush()
    for message in every_reply(task):
        await reply(broker, task, message, sender="worker-1")
    async with asyncio.timeout(5):
        await all_three.wait()
    assert kinds == ["ack", "progress", "result"]


async def test_an_event_of_another_kind_than_its_subject_is_not_in_the_trace(broker):
    """An agent may publish only its own kinds (permissions vouch for the subject): a
    ``routed`` body on its ``accepted`` subject would otherwise pass for the coordinator's
    routing."""
    names = broker.names
    task = task_answering_to(names.reply_box("alice", "box-2"))
    await emit(broker, event_for(task, "routed", agent_id="worker-x"))
    forged = event_for(task, "routed", agent_id="worker-y")
    subject = names.event("accepted", task.topic, task.trace_id, task.message_id, "worker-y")
    await broker.publish(subject, envelopes.encode(forged))
    await emit(broker, event_for(task, "accepted", agent_id="worker-x"), sender="worker-x")
    trace = await trace_of(broker, task.message_id)
    shown = [(e.event, e.agent_id) for e in trace]
    assert shown == [("routed", "worker-x"), ("accepted", "worker-x")]
