"""A caller whose backlog on a topic is full: its publish waits for room (backpressure), and
gets the SDK's own error when none comes within the task's ttl; nothing is sent then."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from agentreach import BacklogFull, InvokeError, ReachClient
from agentreach.broker import SubjectFull, Topology, provision, read_stream
from agentreach.broker.limits import StorageLimits
from agentreach.broker.streams import delete_message
from agentreach.envelopes import decode_task


async def _two_per_subject(broker) -> None:  # type: ignore[no-untyped-def]
    """An intake that keeps two tasks per caller and topic; nothing takes them here."""
    limits = StorageLimits(tasks_per_subject=2)
    await provision(broker, Topology.default(broker.names, limits=limits))


async def test_a_task_past_the_callers_backlog_for_its_whole_ttl_raises_backlog_full(broker):
    """Two tasks fill the caller's backlog on the topic; a third is refused at the server
    until its ttl has passed, then raises BacklogFull (it was the broker's SubjectFull, at
    once, with the server's words), and is not stored."""
    names = broker.names
    await _two_per_subject(broker)
    async with ReachClient(broker=broker) as client:
        for n in range(2):
            await client.publish("summarize", {"n": n})
        with pytest.raises(BacklogFull) as caught:
            await client.publish("summarize", {"n": 2}, message_id="one-too-many", ttl_ms=300)
        with pytest.raises(BacklogFull):
            await client.invoke("summarize", {"n": 3}, ttl_ms=300)
        caller = client.caller
    error = caught.value
    assert isinstance(error, InvokeError) and isinstance(error, SubjectFull)
    assert error.message_id == "one-too-many"
    assert "'summarize' was not sent" in str(error) and caller in str(error)
    assert "tasks_per_subject" in str(error) and "ttl of 300 ms" in str(error)
    stored = await read_stream(broker, names.tasks_stream, names.task("summarize", caller))
    assert len(stored) == 2


async def test_a_task_the_full_intake_does_not_take_says_the_intake_is_full(broker):
    """A whole intake at its byte limit (no coordinator takes tasks): the caller is told
    that, not that its own backlog on the topic is full (both are err_code 10077), and a
    warning says it waits, once."""
    limits = StorageLimits(tasks_bytes=4_096)
    await provision(broker, Topology.default(broker.names, limits=limits))
    async with ReachClient(broker=broker) as client:
        with capture_logs() as logs, pytest.raises(BacklogFull) as caught:
            for n in range(40):  # ~200 bytes each, past 4 KiB
                await client.publish("summarize", {"n": n, "text": "x" * 100}, ttl_ms=300)
    said = str(caught.value)
    assert "the intake was full (maximum bytes exceeded" in said and "limits.tasks_bytes" in said
    assert "tasks_per_subject" not in said
    waits = [e for e in logs if e["event"] == "the intake is full; waiting for room"]
    assert len(waits) == 1


async def test_a_publish_past_the_callers_backlog_waits_for_room(broker):
    """The third task waits while the backlog is full and is stored as soon as one of the
    two is taken: a burst goes at the pace its tasks are taken, nothing refused or lost."""
    names = broker.names
    await _two_per_subject(broker)
    async with ReachClient(broker=broker) as client:
        for n in range(2):
            await client.publish("summarize", {"n": n})
        waiting = asyncio.create_task(client.publish("summarize", {"n": 2}, ttl_ms=30_000))
        subject = names.task("summarize", client.caller)
        await asyncio.sleep(0.3)  # refused and tried again meanwhile: the point of the test
        assert not waiting.done()
        first = (await read_stream(broker, names.tasks_stream, subject))[0]
        await delete_message(broker, names.tasks_stream, first.stream_seq)  # one taken
        message_id, _ = await asyncio.wait_for(waiting, 10)
    stored = await read_stream(broker, names.tasks_stream, subject)
    assert len(stored) == 2 and message_id in {decode_task(m.data).message_id for m in stored}
