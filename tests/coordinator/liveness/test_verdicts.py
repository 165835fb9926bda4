"""Verdicts written behind the judge: coalesced per agent, events in order, nothing left."""

from __future__ import annotations

import asyncio

from agentreach.broker import NoStreamError
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import agent_event
from agentreach.broker.streams import StoredMessage
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator.liveness.verdicts import VerdictWriter
from agentreach.envelopes import Liveness, LivenessState, decode_event


def _queue(writer: VerdictWriter, agent_id: str, state: LivenessState) -> None:
    writer.put(
        Liveness(agent_id=agent_id, state=state, since_ms=1),
        agent_event(agent_id, "agent_state", state=state),
    )


async def _all_written(writer: VerdictWriter, timeout_s: float = 5) -> bool:
    """Run the writer until what is queued is through (False after ``timeout_s``)."""
    running = asyncio.create_task(writer.run())
    try:
        return await writer.written(timeout_s=timeout_s)
    finally:
        await cancel_and_wait(running)


async def _history(broker, agent_id: str) -> list[StoredMessage]:  # type: ignore[no-untyped-def]
    name = broker.names.liveness_bucket
    return await messages_on(broker, f"KV_{name}", f"$KV.{name}.{agent_id}")


async def test_a_newer_verdict_replaces_an_unwritten_one_and_events_keep_their_order(broker):
    seen: list[tuple[str, str]] = []
    all_seen = asyncio.Event()

    async def on_event(msg) -> None:  # type: ignore[no-untyped-def]
        event = decode_event(msg.data)
        seen.append((event.agent_id or "", event.detail["state"]))
        if len(seen) == 3:
            all_seen.set()

    await broker.nc.subscribe(broker.names.events_of_kind("agent_state"), cb=on_event)
    writer = VerdictWriter(broker)
    _queue(writer, "a", "ONLINE")
    _queue(writer, "a", "SUSPECT")
    _queue(writer, "b", "ONLINE")
    running = asyncio.create_task(writer.run())
    try:
        assert await writer.written(timeout_s=5)
        async with asyncio.timeout(5):
            await all_seen.wait()
    finally:
        await cancel_and_wait(running)
    assert seen == [("a", "ONLINE"), ("a", "SUSPECT"), ("b", "ONLINE")]
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    entry = await verdicts.get("a")
    assert entry is not None and entry.value.state == "SUSPECT"
    assert len(await _history(broker, "a")) == 1  # the ONLINE one was never written


async def test_what_is_queued_when_the_writer_stops_is_still_written(broker):
    writer = VerdictWriter(broker)
    running = asyncio.create_task(writer.run())
    _queue(writer, "early", "ONLINE")
    assert await writer.written(timeout_s=5)  # the writer runs, and waits for more
    _queue(writer, "late", "OFFLINE")
    await cancel_and_wait(running)
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    entry = await verdicts.get("late")
    assert entry is not None and entry.value.state == "OFFLINE"


async def test_waiting_for_the_writes_gives_up_when_the_writer_is_not_running(broker):
    writer = VerdictWriter(broker)
    _queue(writer, "never", "ONLINE")
    assert not await writer.written(timeout_s=0.1)


async def test_a_verdict_is_written_once_jetstream_answers_again(broker, monkeypatch):
    """A cluster without a majority refuses writes for as long as it lasts: a verdict given
    up after three tries left an agent SUSPECT in KV, unrouted by every replica, for six
    minutes after the nodes came back (a cluster walkthrough). It is tried until written."""
    real = broker.publish_all
    refused: list[int] = []

    async def no_leader_yet(messages, **options):  # type: ignore[no-untyped-def]
        if len(refused) < 6:  # twice the tries a write had before it was given up
            refused.append(1)
            return [NoStreamError("no stream answered: no leader")] * len(messages)
        return await real(messages, **options)

    monkeypatch.setattr(broker, "publish_all", no_leader_yet)
    writer = VerdictWriter(broker)
    _queue(writer, "back", "ONLINE")
    assert await _all_written(writer, timeout_s=10)
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    entry = await verdicts.get("back")
    assert len(refused) == 6 and entry is not None and entry.value.state == "ONLINE"


async def test_an_earlier_terms_unwritten_verdicts_are_not_written_in_the_next(broker):
    """A quorum loss took the liveness lease while SUSPECT verdicts waited to be written;
    the next term restored ONLINE from the bucket, then wrote them: every agent stayed
    SUSPECT in KV (unrouted) while the judge held it ONLINE, until a restart."""
    writer = VerdictWriter(broker)
    _queue(writer, "stale-1", "SUSPECT")  # the lost term's, never written
    await writer.forget()  # the next term begins
    assert await writer.written(timeout_s=0.1)  # nothing is owed
    _queue(writer, "fresh-1", "ONLINE")
    assert await _all_written(writer)
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    assert await verdicts.get("stale-1") is None
    assert (await verdicts.get("fresh-1")) is not None
