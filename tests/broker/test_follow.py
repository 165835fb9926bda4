"""Following a stream: what was stored first, then each new message, and when the first
part is done (``caught_up``)."""

from __future__ import annotations

import asyncio

from agentreach.broker import Broker
from agentreach.broker.consume import follow
from agentreach.envelopes import now_ms


async def _count_until_caught_up(broker: Broker, filter_subject: str) -> int:
    caught_up = asyncio.Event()
    seen = 0

    async def read() -> None:
        nonlocal seen
        async for _ in follow(
            broker,
            stream=broker.names.events_stream,
            filter_subjects=(filter_subject,),
            since_ms=now_ms() - 60_000,
            size=64,
            caught_up=caught_up,
        ):
            seen += 1

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(caught_up.wait(), 20)
        return seen
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_caught_up_is_set_once_every_stored_message_was_yielded(broker: Broker):
    """Across several fetches (300 messages, 64 a fetch), and with nothing stored at all:
    what reads a window (`reach top --once`) can tell when it has all of it."""
    kind = broker.names.events_of_kind("completed")
    for n in range(300):
        await broker.publish(kind.replace(">", f"t.{n}"), b"{}")
    assert await _count_until_caught_up(broker, kind) == 300
    assert await _count_until_caught_up(broker, broker.names.events_of_kind("expired")) == 0
