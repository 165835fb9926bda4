"""Replies and traces through a real server: a workflow is sent only what its engine reads,
and a trace shows only events that are what their subjects say."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.broker import Broker, ConnectionBroke, NoStreamError, Topology, provision
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import (
    about,
    agent_event,
    emit,
    event_for,
    reply,
    trace_of,
    unvouched,
)
from agentreach.broker.names import COORDINATOR, Names
from agentreach.envelopes import Ack, Capacity, Progress, Result, Routed, Task, new_id
from tests.e2e.test_startup_and_restarts import RestartableServer
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


async def test_a_workflows_result_is_stored_or_its_sender_told_it_was_not(broker):
    """REACH_WORKFLOWS stores a step's result, whatever was stored before under the id a
    sender might have used (the dedup is stream-wide: another agent of the workflow could
    pre-empt a predictable id). With no stream to store it (a leader election, a missing
    stream) the sender hears so, where a core publish was dropped in silence and the
    instance waited for its deadline with the step's work done."""
    names = broker.names
    task = task_answering_to(names.workflow_reply("instance-2"))
    subject = f"{task.reply_to}.worker-1"
    for guessed in (f"{task.message_id}-result-1-worker-1", task.message_id):
        await broker.publish(subject, b'{"forged": true}', headers={"Nats-Msg-Id": guessed})
    await reply(broker, task, Result(**about(task, result={"ok": True})), sender="worker-1")
    stored = await messages_on(broker, names.workflows_stream, subject)
    assert envelopes.decode_reply(stored[-1].data).result == {"ok": True}
    elsewhere = Names(prefix="unprovisioned")
    lost = task_answering_to(elsewhere.workflow_reply("instance-3"))
    broker.names = elsewhere
    try:
        with pytest.raises(NoStreamError):
            await reply(broker, lost, Result(**about(lost, result={})), sender="worker-1")
    finally:
        broker.names = names


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


async def test_a_routing_decided_before_a_break_tells_nobody_after_it(tmp_path: Path):
    """The router's notice and ``routed`` event, written with the break count of its
    run-once read, are refused once the connection broke: sent after it (the notice from
    nats-py's buffer, the event retried through the outage), they told the caller and the
    trace of a route the refused dispatch never took. Decided after the reconnect, both go."""
    async with RestartableServer(tmp_path / "nats") as server, Broker(server.url) as broker:
        await provision(broker, Topology.default(broker.names))
        task = task_answering_to(broker.names.reply_box("alice", "box-1"))
        notice = Routed(**about(task), agent_id="worker-1")
        routed = event_for(task, "routed", agent_id="worker-1")
        decided = broker.link.breaks
        await server.stop()
        told = asyncio.gather(
            reply(broker, task, notice, since_break=decided),
            emit(broker, routed, since_break=decided),
            return_exceptions=True,
        )
        await server.start()
        outcomes = await asyncio.wait_for(told, 30)
        assert [type(outcome) for outcome in outcomes] == [ConnectionBroke, ConnectionBroke]
        assert await trace_of(broker, task.message_id) == []
        heard = await broker.subscribe(f"{task.reply_to}.*")
        await broker.flush()
        await reply(broker, task, notice, since_break=broker.link.breaks)
        await emit(broker, routed, since_break=broker.link.breaks)
        assert (await heard.next(timeout_s=5)).data == envelopes.encode(notice)
        assert [event.event for event in await trace_of(broker, task.message_id)] == ["routed"]


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


async def test_an_agents_event_about_itself_is_not_in_another_messages_trace(broker):
    """``clock_drift`` is an agent's event about itself: one naming alice's message was
    shown in her trace, and its attempt 99 counted in her audit record."""
    task = task_answering_to(broker.names.reply_box("alice", "box-3"))
    await emit(broker, event_for(task, "routed", agent_id="worker-x"))
    planted = msgspec.structs.replace(
        event_for(task, "clock_drift", agent_id="mallory", note="refund approved"), attempt=99
    )
    await emit(broker, planted, sender="mallory")
    await emit(broker, event_for(task, "accepted", agent_id="worker-x"), sender="worker-x")
    own = agent_event("mallory", "clock_drift", drift_s=3.0)
    await emit(broker, own, sender="mallory")
    assert [e.event for e in await trace_of(broker, task.message_id)] == ["routed", "accepted"]
    assert [e.event for e in await trace_of(broker, own.message_id)] == ["clock_drift"]


async def test_an_agents_event_is_of_the_caller_its_attempt_was_routed_for(broker):
    """One caller's message id may be another's: mallory had her own task under alice's id
    routed to herself, then said in a `failed` event that it was alice's."""
    alice = msgspec.structs.replace(task_answering_to("_INBOX.a"), caller="alice")
    own = msgspec.structs.replace(alice, caller="mallory")
    again = msgspec.structs.replace(own, attempt=2)
    await emit(broker, event_for(alice, "routed", agent_id="bob"))
    for routed in (own, again):
        await emit(broker, event_for(routed, "routed", agent_id="mallory"))
    # Each (attempt, sender) reports once: the stream drops a second under its Nats-Msg-Id.
    for attempt, caller in ((1, "alice"), (2, None)):
        run = msgspec.structs.replace(own, attempt=attempt)
        said = event_for(run, "failed", agent_id="mallory")
        await emit(broker, msgspec.structs.replace(said, caller=caller), sender="mallory")
    await emit(broker, event_for(alice, "accepted", agent_id="bob"), sender="bob")
    trace = await trace_of(broker, alice.message_id)
    shown = [(e.event, e.attempt, e.agent_id, e.caller) for e in trace]
    assert shown == [
        ("routed", 1, "bob", "alice"),
        ("routed", 1, "mallory", "mallory"),
        ("routed", 2, "mallory", "mallory"),
        ("failed", 2, "mallory", None),  # names no caller: its routing's
        ("accepted", 1, "bob", "alice"),
    ]


async def test_an_event_whose_routing_is_not_stored_yet_is_left_out_quietly(broker):
    """An agent's event whose ``routed`` is not stored yet, after a restart or an election,
    is left out of the trace; said at debug, as those who act on it look again (a rolling
    restart made 7 warnings that spoke of forgery). A forged kind is still a warning."""
    names = broker.names
    task = task_answering_to(names.reply_box("alice", "box-4"))
    await emit(broker, event_for(task, "accepted", agent_id="worker-x"), sender="worker-x")
    forged = event_for(task, "accepted", agent_id="worker-z")
    await emit(broker, forged, sender="worker-y")
    with capture_logs() as logs:
        assert await trace_of(broker, task.message_id) == []
    said = {
        (e["log_level"], e["why"].split(" (")[0]) for e in logs if e["event"] == "events left out"
    }
    assert said == {
        ("debug", "no routed event gives their attempt to their sender"),
        ("warning", "their body names another agent than their sender"),
    }


async def test_a_forged_event_is_said_once_with_its_message_id_however_often_it_is_read(broker):
    """Every read of a message's events finds a forged one again: one forged `completed`
    made seven warnings, each saying "count 1" (a secured trial). It is said once."""
    task = task_answering_to(broker.names.reply_box("alice", "box-5"))
    forged = event_for(task, "completed", agent_id="victim-1")
    await emit(broker, forged, sender="liar-1")
    with capture_logs() as logs:
        for _ in range(3):
            assert await trace_of(broker, task.message_id) == []
    said = [e for e in logs if e["event"] == "events left out"]
    assert len(said) == 1 and said[0]["message_ids"] == [task.message_id]
    assert said[0]["count"] == 1 and said[0]["log_level"] == "warning"


@pytest.mark.parametrize(
    ("kind", "body", "sender", "why"),
    [
        ("failed", "failed", COORDINATOR, None),
        ("failed", "dead_lettered", COORDINATOR, None),  # the coordinator's, as it is
        ("failed", "failed", "worker-x", None),
        ("failed", "dead_lettered", "worker-x", "a kind only the coordinator sends"),
        ("alert", "alert", "worker-x", "a kind only the coordinator sends"),
        ("failed", "completed", "worker-x", "another kind than their subject"),
        ("replayed", "replayed", "ops-1", None),
    ],
)
def test_what_a_subject_vouches_for(kind, body, sender, why):
    """Permissions vouch for an event's subject (its kind and sender token), not its body."""
    names = Names()
    task = task_answering_to("_INBOX.x")
    event = event_for(task, body, agent_id=None if sender == COORDINATOR else sender)
    subject = names.event(kind, task.topic, task.trace_id, task.message_id, sender)
    found = unvouched(names, subject, event)
    assert found is None if why is None else why in (found or "")
    named_another = msgspec.structs.replace(event, agent_id="victim")
    assert sender == COORDINATOR or unvouched(names, subject, named_another) is not None
