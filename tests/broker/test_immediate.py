"""Subscriptions whose messages are handed over as the connection reads them."""

from __future__ import annotations

import asyncio

from agentreach.broker.immediate import subscribe_immediate


async def test_each_message_is_handed_over_in_order_and_nothing_counts_as_pending(broker):
    got: list[bytes] = []
    done = asyncio.Event()

    def handle(msg) -> None:  # type: ignore[no-untyped-def]
        got.append(msg.data)
        if len(got) == 50:
            done.set()

    sub = await subscribe_immediate(broker.nc, "immediate.order", handle)
    for n in range(50):
        await broker.nc.publish("immediate.order", str(n).encode() * 1000)
    await asyncio.wait_for(done.wait(), timeout=5)
    assert got == [str(n).encode() * 1000 for n in range(50)]
    assert sub.pending_bytes == 0  # nats-py's slow-consumer limit is never approached
    assert sub.pending_msgs == 0
    await sub.unsubscribe()


async def test_a_handler_that_raises_drops_that_message_and_the_connection_goes_on(broker):
    got: list[bytes] = []
    done = asyncio.Event()

    def handle(msg) -> None:  # type: ignore[no-untyped-def]
        if msg.data == b"bad":
            raise ValueError("a bug in a handler")
        got.append(msg.data)
        done.set()

    sub = await subscribe_immediate(broker.nc, "immediate.raise", handle)
    await broker.nc.publish("immediate.raise", b"bad")
    await broker.nc.publish("immediate.raise", b"good")
    await asyncio.wait_for(done.wait(), timeout=5)
    assert got == [b"good"]
    assert broker.nc.is_connected
    await broker.flush()  # the connection still answers
    await sub.unsubscribe()
