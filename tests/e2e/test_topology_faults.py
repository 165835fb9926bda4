"""Streams, buckets and consumers that go missing under a running coordinator come back."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import read_stream
from tests.support import until_true


async def test_a_deleted_dlq_is_provisioned_again_and_the_letter_lands(
    broker, coordinator, watcher
):
    """With REACH_DLQ deleted (and a subscriber on its subjects, which turns "no stream"
    into a timeout), a dead letter provisions it again, loudly, and is stored; nothing is
    logged as dead-lettered before it is."""
    names = broker.names
    await broker.js.delete_stream(names.dlq_stream)
    with capture_logs() as logs:
        async with ReachClient(broker=broker) as client:
            message_id, _ = await client.publish("nobody_serves_this", {})
        await watcher.dead_letter("no_route", message_id=message_id, timeout=20)
        await until_true(lambda: _stored_letters(broker, message_id))

        async def said() -> bool:  # logged once the letter's ack is back, after it is stored
            return any(e["event"] == "dead-lettered" for e in logs)

        await until_true(said)
    events = [e["event"] for e in logs]
    again = events.index("streams or buckets were missing; provisioned again")
    assert names.dlq_stream in logs[again]["created"]
    assert again < events.index("dead-lettered")


async def _stored_letters(broker, message_id: str) -> list[object]:  # type: ignore[no-untyped-def]
    names = broker.names
    try:
        stored = await read_stream(broker, names.dlq_stream, names.dlq_wildcard)
    except Exception:
        return []
    return [m for m in stored if message_id.encode() in m.data]


async def test_a_deleted_intake_stream_comes_back_and_tasks_flow(broker, coordinator):
    """REACH_TASKS deleted (its consumer with it): the coordinator makes both again and the
    next task is served, without a restart."""
    agent = Agent("survivor", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        return payload

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        assert await client.invoke("echo", {"n": 1}) == {"n": 1}
        await broker.js.delete_stream(broker.names.tasks_stream)
        async with asyncio.timeout(30):
            while True:
                try:
                    result = await client.invoke("echo", {"n": 2}, ack_deadline_ms=1_000)
                    break
                except Exception:
                    await asyncio.sleep(0.5)
    assert result == {"n": 2}
