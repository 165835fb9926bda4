"""The tasks the coordinator publishes itself (a reassignment, a workflow step, a task a person
sent on) through a real server whose intake keeps a small backlog per subject: an operator's
burst on the bare ``reach.task.<topic>`` refuses none of them (they have a subject of their
own), and one that its own subject refuses for its whole ttl ends in a dead letter."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentreach import envelopes
from agentreach.agents import Agent, ManualReview, ReachClient, TaskContext
from agentreach.broker import Broker, Topology, provision, read_stream
from agentreach.broker.errors import SubjectFull
from agentreach.broker.limits import StorageLimits
from agentreach.broker.pipelined import Outgoing
from agentreach.coordinator.liveness.reassign import reassign_tasks
from agentreach.envelopes import Task
from tests.e2e.intent_support import Caller
from tests.e2e.routing_support import fast, serving, table, worker
from tests.e2e.test_workflows import workflows
from tests.support import DISPATCHED, until_true

BOUND = 3
LIMITS = StorageLimits(tasks_per_subject=BOUND)
ROUTES = table("""
rules:
  - {name: to-people, match: {topic: review_me}, to: {manual: desk}}
  - {name: fallback, fallback: true, to: {}}
""")


async def burst(broker: Broker, subject: str) -> None:
    """Fill ``subject`` to the bound, as an operator's `nats pub -J` burst would; the next
    publish there is refused."""
    bodies = [Outgoing(subject, json.dumps({"burst": i}).encode(), {}) for i in range(BOUND + 1)]
    outcomes = await broker.publish_all(bodies)
    assert outcomes[:BOUND] == [None] * BOUND and isinstance(outcomes[BOUND], SubjectFull)


@contextlib.asynccontextmanager
async def intake_paused(broker: Broker) -> AsyncIterator[None]:
    """The coordinators take nothing from the intake meanwhile (a consumer paused on the
    server), so what is published there stays as a backlog not yet taken."""
    names = broker.names
    subject = f"$JS.API.CONSUMER.PAUSE.{names.tasks_stream}.{names.coordinator_intake}"
    paused = await broker.nc.request(
        subject, json.dumps({"pause_until": "2099-01-01T00:00:00Z"}).encode(), timeout=5
    )
    assert json.loads(paused.data).get("paused") is True, paused.data
    try:
        yield
    finally:
        await broker.nc.request(subject, b"{}", timeout=5)


async def stored_on(broker: Broker, subject: str) -> list[Task]:
    """The tasks waiting on one intake subject."""
    stored = await read_stream(broker, broker.names.tasks_stream, subject)
    return [envelopes.decode_task(m.data) for m in stored]


async def test_a_reassignment_goes_through_beside_a_full_bare_backlog(
    broker, start_coordinator, watcher
):
    """An OFFLINE agent's queued task is moved at once while a burst fills the bare
    subject of its topic: it waits on the coordinator's own intake subject, and once a
    coordinator runs it completes as attempt 2 with its caller kept."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=LIMITS))
    await burst(broker, names.task("work"))
    queued = Task(
        v=1,
        message_id="moved-1",
        trace_id="moved-1",
        topic="work",
        caller="alice",
        to_agent="gone-1",
        ttl_ms=60_000,
    )
    await broker.publish(
        names.dispatch("gone-1", "P1"), envelopes.encode(queued), headers=DISPATCHED
    )
    assert await reassign_tasks(broker, "gone-1") == 1
    [waiting] = await stored_on(broker, names.coordinator_task("work"))
    assert (waiting.message_id, waiting.attempt, waiting.caller) == ("moved-1", 2, "alice")
    counts: Counter[str] = Counter()
    async with worker("w", counts).running(broker=broker), start_coordinator(fast(limits=LIMITS)):
        done = await watcher.event("completed", message_id="moved-1")
    routed = next(e for e in watcher.events if e.event == "routed" and e.message_id == "moved-1")
    assert done.attempt == 2 and routed.caller == "alice"
    assert watcher.count("dead_lettered", {"moved-1"}) == 0


async def test_a_task_a_person_sends_on_goes_through_beside_a_full_bare_backlog(
    broker, start_coordinator, watcher
):
    """A person sends a waiting task on to a topic whose bare subject a burst has filled:
    it waits on the coordinator's own subject instead of being refused (which stopped the
    whole manual-review duty), and its caller gets the agent's answer."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=LIMITS))
    counts: Counter[str] = Counter()
    config = fast(routing=ROUTES, limits=LIMITS)
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, worker("w", counts)),
        ReachClient(broker=broker) as client,
        Caller(broker, names.reply_box("client", "sent")) as caller,
    ):
        message_id, _ = await client.publish("review_me", {}, reply_to=caller.subject)
        await caller.reply(message_id, "ack")
        async with intake_paused(broker):
            await burst(broker, names.task("work"))
            item = await ManualReview(broker, by="carol").send(message_id, "work")
            await watcher.event("manual_sent", message_id=message_id)
            [sent] = await until_true(lambda: stored_on(broker, names.coordinator_task("work")))
            assert sent.message_id == item.sent_as
        result = await caller.reply(item.sent_as, "result")
        await watcher.until(lambda: watcher.count("completed") == BOUND + 1 or None, "all")
    assert result.result == {"by": "w"}  # type: ignore[union-attr]
    assert counts["w"] == BOUND + 1  # the burst's tasks, and the one sent on


async def test_a_task_a_person_sends_on_that_finds_no_room_in_its_ttl_is_dead_lettered(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """When even the coordinator's own subject of the topic stays full for the whole ttl of
    the task a person sent on, that task ends in a dead letter `rejected` (error
    `backlog_full`, naming the subject and the limit) and its caller is told; the
    manual-review duty goes on (the next answer reaches its caller)."""
    monkeypatch.setattr(envelopes, "DEFAULT_TTL_MS", 1_500)  # a sent task's ttl
    names = broker.names
    await provision(broker, Topology.default(names, limits=LIMITS))
    async with (
        start_coordinator(fast(routing=ROUTES, limits=LIMITS)),
        ReachClient(broker=broker) as client,
        Caller(broker, names.reply_box("client", "full")) as caller,
    ):
        sent_on, _ = await client.publish("review_me", {}, reply_to=caller.subject)
        answered, _ = await client.publish("review_me", {}, reply_to=caller.subject)
        await caller.reply(sent_on, "ack")
        await caller.reply(answered, "ack")
        review = ManualReview(broker, by="carol")
        async with intake_paused(broker):
            await burst(broker, names.coordinator_task("work"))
            item = await review.send(sent_on, "work", force=True)  # nobody serves it here
            letter = await watcher.dead_letter("rejected", message_id=item.sent_as)
            error = await caller.reply(item.sent_as, "error")
            await review.answer(answered, {"by": "a person"})
            result = await caller.reply(answered, "result")
    assert letter.error is not None and letter.error.type == "backlog_full"
    assert names.coordinator_task("work") in letter.error.message
    assert "limits.tasks_per_subject" in letter.error.message
    assert letter.envelope is not None and letter.envelope.topic == "work"
    assert error.error.type == "backlog_full"  # type: ignore[union-attr]
    assert result.result == {"by": "a person"}  # type: ignore[union-attr]


def relay(released: asyncio.Event) -> Agent:
    """``first`` waits for ``released``; ``second`` answers at once."""
    agent = Agent("relay", startup_delay=0)

    @agent.handler("first")
    async def first(ctx: TaskContext, payload: Any) -> dict[str, str]:
        await released.wait()
        return {"from": "first"}

    @agent.handler("second")
    async def second(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        return {"second": payload}

    return agent


async def test_a_workflow_step_goes_through_beside_a_full_bare_backlog(
    broker, start_coordinator, watcher
):
    """The workflow's second step is dispatched while a burst fills the bare subject of its
    intent: it waits on the coordinator's own subject, and the workflow completes."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=LIMITS))
    flow = workflows(pair="chain:\n  - {name: a, intent: first}\n  - {name: b, intent: second}\n")
    released = asyncio.Event()
    config = fast(workflows=flow, limits=LIMITS)
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, relay(released)),
        ReachClient(broker=broker) as client,
    ):
        invoked = asyncio.create_task(client.invoke("pair", {"go": 1}, ttl_ms=60_000))
        accepted = await watcher.event("accepted", topic="first")
        async with intake_paused(broker):
            await burst(broker, names.task("second"))
            released.set()
            [step] = await until_true(lambda: stored_on(broker, names.coordinator_task("second")))
        result = await invoked
    assert result == {"second": {"from": "first"}}
    assert step.topic == "second" and step.trace_id == accepted.trace_id
    assert step.reply_to is not None and names.workflow_replies(step.reply_to)
    assert watcher.count("dead_lettered") == 0
