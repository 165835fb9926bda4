"""A max-deliveries advisory about a dispatch: dead-lettered, or answered from the agent's
record when the run was done; but only what the server's own state bears out, and only for a
dispatch the coordinator granted. The server's advisories carry no headers, and neither does
its copy of a stored message a direct get asks none for (`no_hdr`), to any subject: an agent
had its own JSON taken for an advisory naming a stream and sequence of its choice."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.msg import Msg
from nats.js import api
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.broker import Delivery
from agentreach.broker.lifecycle import GRANT_HEADER
from agentreach.broker.streams import get_message
from agentreach.coordinator.delivery.advisories import Advisories
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing import run_once
from tests.support import DISPATCHED

GRANTS = Grants(b"k" * 32)
CONSUMER = "agent-mallory-p1"


async def _advise(broker, stream: str, seq: int, consumer: str = CONSUMER) -> float | None:  # type: ignore[no-untyped-def]
    """What nats-server says when the message at ``seq`` was delivered 5 times (or what a
    copy of someone's JSON says, on the subject it chose): the handler's seconds until it
    looks again, or None."""
    body = {"stream": stream, "consumer": consumer, "stream_seq": seq, "deliveries": 5}
    subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"
    msg = Msg(broker.nc, subject=subject, data=msgspec.json.encode(body))
    return await Advisories(broker, GRANTS).handle(Delivery(msg))


async def _delivered(broker, count: int, agent: str = "mallory") -> None:  # type: ignore[no-untyped-def]
    """The agent's P1 consumer, as an agent makes it, has taken ``count`` of its queue."""
    stream, queue = broker.names.dispatch_stream("P1"), broker.names.dispatch(agent, "P1")
    durable = broker.names.agent_consumer(agent, "P1")
    config = api.ConsumerConfig(durable_name=durable, filter_subject=queue, max_deliver=5)
    await broker.js.add_consumer(stream, config)
    if count:
        pull = await broker.js.pull_subscribe_bind(durable, stream)
        assert len(await pull.fetch(count, timeout=2)) == count


async def _record(broker, message_id: str, state: str, **fields: object) -> None:  # type: ignore[no-untyped-def]
    """bob's record of alice's ``message_id``, sealed as a granted attempt's is."""
    records = await broker.bucket(broker.names.executions_bucket, envelopes.Execution)
    record = envelopes.Execution(
        message_id=message_id, state=state, agent_id="bob", caller="alice", **fields
    )  # type: ignore[arg-type]
    await records.create(envelopes.execution_key("alice", message_id, "bob"), record)


async def _running_on_bob(broker, message_id: str, *, lease_ms: int) -> int:  # type: ignore[no-untyped-def]
    """alice's ``message_id`` granted to bob, delivered to him, and his record of running it
    under a lease ``lease_ms`` from now: its sequence in his queue."""
    task = envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic="echo", caller="alice",
        to_agent="bob",
    )  # fmt: skip
    grant = {GRANT_HEADER: GRANTS.sign(task, "bob") or ""}
    queue = broker.names.dispatch("bob", "P1")
    stored = await broker.publish(queue, envelopes.encode(task), headers={**DISPATCHED, **grant})
    await _delivered(broker, 1, agent="bob")
    seal = GRANTS.seal("alice", message_id, 1, "bob")
    lease = envelopes.now_ms() + lease_ms
    await _record(broker, message_id, "running", lease_until_ms=lease, seal=seal)
    return stored.seq


def _forged(broker, message_id: str) -> envelopes.Task:  # type: ignore[no-untyped-def]
    return envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic="echo", caller="alice",
        attempt=2, reply_to=broker.names.reply_box("mallory", "loot"), to_agent="mallory",
    )  # fmt: skip


async def test_a_dispatch_without_a_grant_is_answered_from_no_record(broker, watcher):
    """A task someone had the server copy onto its own queue (caller alice, her finished
    message, a reply box of the forger's), NAKed to its last delivery, was taken for the
    coordinator's: ended in alice's name, or answered from her record to the forger's box.
    It is dead-lettered as the bytes it is instead."""
    seal = GRANTS.seal("alice", "order-42", 1, "bob")
    await _record(broker, "order-42", "done", result={"secret": 1}, seal=seal)
    queue = broker.names.dispatch("mallory", "P1")
    forged = _forged(broker, "order-42")
    claimed = {**DISPATCHED, "Nats-Msg-Id": "order-42"}  # the id it would be known by
    first = await broker.publish(queue, envelopes.encode(forged), headers=claimed)
    granted = msgspec.structs.replace(forged, message_id="granted-1", trace_id="granted-1")
    grant = {GRANT_HEADER: GRANTS.sign(granted, "mallory") or ""}
    second = await broker.publish(queue, envelopes.encode(granted), headers={**DISPATCHED, **grant})
    await _delivered(broker, 2)
    stream = broker.names.dispatch_stream("P1")
    await _advise(broker, stream, first.seq)
    letter = await watcher.dead_letter("retries_exhausted")
    assert letter.raw is not None and "order-42" in letter.raw
    assert letter.message_id != "order-42"  # nor its dead_lettered event in alice's trace
    assert not [e for e in watcher.events if e.event == "answered_from_record"]
    await _advise(broker, stream, second.seq)
    ended = await watcher.dead_letter("retries_exhausted", message_id="granted-1")
    assert ended.envelope is not None and ended.envelope.caller == "alice"


async def test_an_advisory_the_server_s_state_does_not_bear_out_is_not_acted_on(broker, watcher):
    """Copies of an agent's JSON taken for advisories: about a bucket's value (copied into a
    dead letter), about a running dispatch the consumer never gave up on (alice's task ended
    while it ran), under a subject naming another consumer than the body."""
    seal = GRANTS.seal("alice", "order-43", 1, "bob")
    await _record(broker, "order-43", "done", result={"secret": 2}, seal=seal)
    queue = broker.names.dispatch("mallory", "P1")
    stored = await broker.publish(queue, envelopes.encode(_forged(broker, "order-43")))
    names, stream = broker.names, broker.names.dispatch_stream("P1")
    with capture_logs() as logs:
        await _advise(broker, f"KV_{names.executions_bucket}", 1, consumer="x")
        await _delivered(broker, 0)
        await _advise(broker, stream, stored.seq)  # in the queue, not delivered yet
        await _advise(broker, stream, stored.seq, consumer="agent-bob-p1")
    said = [e["why"] for e in logs if e["event"] == "max-deliveries advisory not acted on"]
    assert logs[0]["event"] == "an advisory about no agent's queue: not acted on"
    assert len(said) == 2, said
    assert "has not delivered message" in said[0]
    assert "not the one of the agent whose queue holds the message" in said[1]
    assert not watcher.dead_letters
    assert not [e for e in watcher.events if e.message_id == "order-43"]


async def test_a_task_that_runs_is_not_ended_by_an_advisory(broker, watcher):
    """alice's task, granted to bob, ran on bob under a live lease; an advisory naming its
    sequence (small numbers, soon guessed) ended it, dead-lettered and deleted, while bob ran
    on. A run that goes on was not given up on, whatever says so."""
    seq = await _running_on_bob(broker, "order-44", lease_ms=60_000)
    stream = broker.names.dispatch_stream("P1")
    await _advise(broker, stream, seq, consumer="agent-bob-p1")
    assert not watcher.dead_letters
    assert await get_message(broker, stream, seq) is not None  # still bob's


async def test_a_task_whose_agent_died_under_its_lease_ends_when_the_lease_runs_out(
    broker, watcher, monkeypatch: pytest.MonkeyPatch
):
    """An agent with `max_deliver=1` (at most once) killed in a run: JetStream gives up on
    the message under the run's live lease. The advisory was let go, and the task waited in
    the agent's queue to expire at its ttl, "gone silent", where the docs promise
    `retries_exhausted` (a fresh reader). It is looked at again once the lease has run out,
    and dead-lettered then."""
    # A coordinator up for a while: no grace after its first connect (see test_outage_grace).
    monkeypatch.setattr(run_once, "OUTAGE_GRACE_S", 0.0)
    seq = await _running_on_bob(broker, "order-45", lease_ms=1_500)  # nobody renews it
    stream = broker.names.dispatch_stream("P1")
    later_s = await _advise(broker, stream, seq, consumer="agent-bob-p1")
    assert later_s is not None and 1.0 < later_s <= 2.5
    assert not watcher.dead_letters
    await asyncio.sleep(later_s)  # the advisory's redelivery, after the delay it asked for
    assert await _advise(broker, stream, seq, consumer="agent-bob-p1") is None
    letter = await watcher.dead_letter("retries_exhausted", message_id="order-45")
    assert letter.error is not None and "never acknowledged" in letter.error.message
    assert await get_message(broker, stream, seq) is None


async def test_advisories_not_acted_on_are_said_a_few_times_a_minute(broker):
    """Copies of an agent's JSON on the advisories' subjects, as fast as the server stores
    them: the coordinator's log says ten of them a minute, not one line each."""
    advisories = Advisories(broker, GRANTS)
    body = {"stream": "REACH_TASKS", "consumer": "x", "stream_seq": 1, "deliveries": 5}
    subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.REACH_TASKS.x"
    with capture_logs() as logs:
        for _ in range(50):
            msg = Msg(broker.nc, subject=subject, data=msgspec.json.encode(body))
            await advisories.handle(Delivery(msg))
    said = [e for e in logs if e["event"] == "an advisory about no agent's queue: not acted on"]
    assert len(said) == 10
