"""Our own pull requests: a message is handed over as soon as it arrives, what was pulled and
not taken goes back on close, and a consumer deleted under a fetch is said so."""

from __future__ import annotations

import asyncio

import pytest

from agentreach.broker import Broker, ConsumerNotFound, ConsumerSpec, bind, consumer_state
from tests.support import until_true

PRIORITY = "P1"
LONG_WAIT_S = 30.0  # a fetch that held a message for the rest of its batch would wait this


def spec(broker: Broker, durable: str = "pull-test") -> ConsumerSpec:
    names = broker.names
    return ConsumerSpec(
        stream=names.dispatch_stream(PRIORITY),
        durable=durable,
        filter_subjects=(names.dispatch("pull-test", PRIORITY),),
        ack_wait_s=60.0,
    )


async def publish(broker: Broker, *bodies: bytes) -> None:
    for body in bodies:
        await broker.publish(broker.names.dispatch("pull-test", PRIORITY), body)


async def test_a_message_after_a_quiet_gap_is_handed_over_without_waiting_for_a_batch(broker):
    """nats-py's fetch(64) held a lone message until its timeout; ours returns it at once."""
    consumer = await bind(broker, spec(broker))
    try:
        assert await consumer.fetch(64, wait_s=0.2) == []  # quiet: the request expires
        fetching = asyncio.create_task(consumer.fetch(64, wait_s=LONG_WAIT_S))
        await publish(broker, b"lone")
        deliveries = await asyncio.wait_for(fetching, LONG_WAIT_S / 6)
        assert [d.data for d in deliveries] == [b"lone"]
        await deliveries[0].ack()
        # The request stays open between fetches: what it brings meanwhile is queued.
        await publish(broker, b"two", b"three")
        later = await asyncio.wait_for(consumer.fetch(64, wait_s=LONG_WAIT_S), LONG_WAIT_S / 6)
        while len(later) < 2:
            later += await consumer.fetch(64, wait_s=1.0)
        assert [d.data for d in later] == [b"two", b"three"]
    finally:
        await consumer.close()


async def test_what_was_pulled_and_not_taken_comes_back_on_close(broker):
    """close() ends the open request and gives back what it had queued, at once (not after the
    ack wait), to the next process bound to the same durable."""
    consumer = await bind(broker, spec(broker))
    fetching = asyncio.create_task(consumer.fetch(8, wait_s=LONG_WAIT_S))
    await publish(broker, b"a")
    first = await asyncio.wait_for(fetching, LONG_WAIT_S / 6)
    assert [d.data for d in first] == [b"a"]
    await publish(broker, b"b", b"c")  # delivered by the request still open

    async def queued_behind() -> bool:
        state = await consumer_state(broker, spec(broker).stream, "pull-test")
        return state is not None and state.num_ack_pending == 3

    await until_true(queued_behind, timeout=5.0)  # b and c wait in this process's queue
    await first[0].ack()
    await consumer.close()
    again = await bind(broker, spec(broker))
    try:
        taken: list[bytes] = []
        while len(taken) < 2:
            taken += [d.data for d in await again.fetch(8, wait_s=5.0)]
        assert sorted(taken) == [b"b", b"c"]  # given back together: no order among them
    finally:
        await again.close()


async def test_a_consumer_deleted_under_a_fetch_is_said_so(broker):
    consumer = await bind(broker, spec(broker, "pull-gone"))
    try:
        fetching = asyncio.create_task(consumer.fetch(8, wait_s=LONG_WAIT_S))

        async def request_open() -> bool:
            info = await broker.js.consumer_info(spec(broker).stream, "pull-gone")
            return (info.num_waiting or 0) == 1

        await until_true(request_open, timeout=5.0)
        await broker.js.delete_consumer(spec(broker).stream, "pull-gone")
        with pytest.raises(ConsumerNotFound, match="pull request ended"):
            await asyncio.wait_for(fetching, LONG_WAIT_S / 6)
    finally:
        await consumer.close()
