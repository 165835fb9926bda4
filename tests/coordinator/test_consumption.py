"""How the coordinator consumes a stream, on a real server: each message settled on its own."""

from __future__ import annotations

import asyncio

from agentreach.broker import ConsumerSpec, Delivery, Provisioner, Topology, bind, consumer_state
from agentreach.coordinator.consumption import Consumption
from agentreach.envelopes import headers as h
from tests.support import until_true


async def test_a_slow_message_holds_up_no_other(broker):
    """Handled and settled one by one (not a batch at a time): while one message's handling
    waits (a rate limit, an election), the messages after it are handled and acknowledged."""
    names = broker.names
    spec = ConsumerSpec(
        stream=names.tasks_stream,
        durable="consumption-test",
        filter_subjects=(names.tasks_wildcard,),
    )
    consumer = await bind(broker, spec)
    release = asyncio.Event()
    handled: list[bytes] = []

    async def handle(delivery: Delivery) -> float | None:
        if delivery.data == b'"slow"':
            await release.wait()
        handled.append(delivery.data)
        return None

    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    runner = asyncio.create_task(consumption.run(consumer, 8, handle))
    try:
        await broker.publish(names.task("echo"), b'"slow"', headers={h.MSG_ID: "c-slow"})

        async def only_the_slow_one_left() -> bool:
            state = await consumer_state(broker, names.tasks_stream, "consumption-test")
            return state is not None and state.num_ack_pending == 1 and state.num_pending == 0

        await until_true(only_the_slow_one_left, timeout=10.0)  # in hand, and waiting
        for n, body in enumerate([b'"one"', b'"two"']):  # fetched only after it, batch-wise
            await broker.publish(names.task("echo"), body, headers={h.MSG_ID: f"c-{n}"})
        await until_true(only_the_slow_one_left, timeout=10.0)
        assert handled == [b'"one"', b'"two"']
        release.set()

        async def all_settled() -> bool:
            state = await consumer_state(broker, names.tasks_stream, "consumption-test")
            return state is not None and state.num_ack_pending == 0

        await until_true(all_settled, timeout=10.0)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await consumer.close()
    assert handled[-1] == b'"slow"'
