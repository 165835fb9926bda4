"""Durable pull consumers: one that starts at new messages, deleted under a running process,
is made again where that process left off, and keeps that start through later binds."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from agentreach.broker import (
    Broker,
    ConsumerSpec,
    EmbeddedServer,
    PullConsumer,
    Topology,
    bind,
    consumer_state,
    provision,
)
from agentreach.envelopes import headers as h


def counting(broker: Broker) -> ConsumerSpec:
    names = broker.names
    return ConsumerSpec(
        stream=names.events_stream,
        durable="counted-gone",
        filter_subjects=(names.events_wildcard,),
        new_only=True,
        acknowledged=False,
    )


async def publish(broker: Broker, *numbers: int) -> None:
    subject = broker.names.event("completed", "echo", "trace", "m", "agent")
    for n in numbers:
        await broker.publish(subject, str(n).encode(), headers={h.MSG_ID: f"counted-{n}"})


async def fetched(consumer: PullConsumer) -> list[bytes]:
    """What the next fetch that finds anything brings (each failed one pauses and mends)."""
    async with asyncio.timeout(15):
        while not (deliveries := await consumer.next_batch(8, wait_s=0.5)):
            pass
    return [delivery.data for delivery in deliveries]


async def test_a_counting_consumer_deleted_by_hand_is_made_again_where_it_left_off(broker):
    """`nats consumer rm` of the metrics consumer: made again from now, the events stored
    meanwhile were never counted, silently (an outside trial)."""
    spec = counting(broker)
    consumer = await bind(broker, spec)
    try:
        await publish(broker, 1, 2, 3)
        assert await fetched(consumer) == [b"1", b"2", b"3"]
        await broker.js.delete_consumer(spec.stream, spec.durable)
        await publish(broker, 4, 5)
        assert await fetched(consumer) == [b"4", b"5"]
    finally:
        await consumer.close()
    # A process started later binds the same spec: the consumer keeps its start (it is not
    # made again from now), so what was stored while nobody was bound is still counted.
    await publish(broker, 6)
    restarted = await bind(broker, spec)
    try:
        assert await fetched(restarted) == [b"6"]
    finally:
        await restarted.close()
    state = await consumer_state(broker, spec.stream, spec.durable)
    assert state is not None and state.deliver_policy == "by_start_sequence"
    assert state.ack_policy == "none"


async def test_a_pause_for_an_outage_is_the_connections_to_say_not_each_consumers(tmp_path):
    """A fetch failing while the connection is down is the outage's, which the connection
    says ("nats disconnected", "nats reconnected"): each consumer said it again, and again
    when it was over (a dozen warnings for a 5 s outage, an outside trial). A failure while
    connected (its consumer deleted) is still a warning."""
    async with (
        EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server,
        Broker(server.url, name="consuming") as broker,
    ):
        await provision(broker, Topology.default(broker.names))
        spec = counting(broker)
        consumer = await bind(broker, spec)
        try:
            await server.stop()
            with capture_logs() as outage:
                assert await consumer.next_batch(8, wait_s=0.2) == []
                await server.restart()
                await publish(broker, 1)
                assert await fetched(consumer) == [b"1"]
            with capture_logs() as deleted:
                await broker.js.delete_consumer(spec.stream, spec.durable)
                await publish(broker, 2)
                assert await fetched(consumer) == [b"2"]
        finally:
            await consumer.close()
    assert _levels(outage) == {"consuming paused; retrying": "debug", "consuming again": "debug"}
    assert _levels(deleted) == {"consuming paused; retrying": "warning", "consuming again": "info"}


def _levels(logs: list[dict]) -> dict[str, str]:
    return {e["event"]: e["log_level"] for e in logs if e["event"].startswith("consuming ")}
