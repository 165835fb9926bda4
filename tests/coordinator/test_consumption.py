"""How the coordinator consumes a stream, on a real server: each message settled on its own."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from agentreach.broker import (
    BrokerError,
    ConsumerSpec,
    Delivery,
    Names,
    Provisioner,
    PullConsumer,
    Topology,
    bind,
    consumer_state,
)
from agentreach.coordinator.consumption import Consumption
from agentreach.coordinator.observability.endpoint import AfterFirstScrape, Readiness
from agentreach.coordinator.observability.flow import FlowMetrics
from agentreach.envelopes import headers as h
from tests.support import eventually, until_true


async def _intake_consumer(broker, durable: str, **settings: float) -> PullConsumer:  # type: ignore[no-untyped-def]
    """A consumer of every task on the intake, as the coordinator's, with ``settings``."""
    names = broker.names
    spec = ConsumerSpec(
        stream=names.tasks_stream,
        durable=durable,
        filter_subjects=(names.tasks_wildcard,),
        **settings,  # type: ignore[arg-type]
    )
    return await bind(broker, spec)


async def test_a_slow_message_holds_up_no_other(broker):
    """Handled and settled one by one (not a batch at a time): while one message's handling
    waits (a rate limit, an election), the messages after it are handled and acknowledged."""
    names = broker.names
    consumer = await _intake_consumer(broker, "consumption-test")
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

        async def both_settled() -> bool:
            # Handled first: the consumer's state read at once after the publishes can
            # still show the slow one alone (it failed so once on a busy machine).
            return len(handled) == 2 and await only_the_slow_one_left()

        await until_true(both_settled, timeout=10.0)
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


async def test_a_fold_counts_in_order_acknowledges_nothing_and_says_what_it_could_not_count(
    broker,
):
    names = broker.names
    spec = _counting(names, "fold-test")
    consumer = await bind(broker, spec)
    subject = names.event("completed", "echo", "trace", "m", "agent")
    counted: list[bytes] = []
    all_counted = asyncio.Event()

    class Counting:
        async def look_up(self, deliveries: object) -> None:
            pass

        def count(self, delivery: Delivery) -> None:
            if delivery.data == b'"bad"':
                raise ValueError("cannot count this")
            counted.append(delivery.data)
            if len(counted) == 3:
                all_counted.set()

        def caught_up(self) -> None:
            pass

        async def ready(self) -> None:
            pass

    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    with capture_logs() as logs:
        runner = asyncio.create_task(consumption.fold(consumer, 8, Counting()))
        try:
            for n, body in enumerate([b'"one"', b'"bad"', b'"two"', b'"three"']):
                await broker.publish(subject, body, headers={h.MSG_ID: f"f-{n}"})
            await asyncio.wait_for(all_counted.wait(), timeout=10)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await consumer.close()
    assert counted == [b'"one"', b'"two"', b'"three"']
    state = await consumer_state(broker, names.events_stream, "fold-test")
    assert state is not None and state.ack_policy == "none" and state.num_ack_pending == 0
    said = [e for e in logs if e["event"] == "a message could not be counted"]
    assert len(said) == 1 and said[0]["subject"] == subject
    assert said[0]["stream_seq"] == 2 and said[0]["exc_info"]


async def test_a_replica_says_it_caught_up_once_the_other_took_what_it_left(broker):
    """Replica A counted an event with two more held after it, and replica B, sharing the
    consumer, took those two: A's metrics feed lag stayed "behind" till its next event (an
    outside trial: `ReachMetricsFeedLagging` fired at 455 s, the counters up to date). A
    fetch that finds nothing says A caught up."""
    names = broker.names
    spec = _counting(names, "fold-shared")
    a, b = await bind(broker, spec), await bind(broker, spec)
    subject = names.event("completed", "echo", "trace", "m", "agent")
    for n in range(3):
        await broker.publish(subject, b"{}", headers={h.MSG_ID: f"shared-{n}"})
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True)
    [first] = await a.fetch(1)
    flow.count(first)
    assert flow.behind == 2
    assert len(await b.fetch(8)) == 2
    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    runner = asyncio.create_task(consumption.fold(a, 8, AfterFirstScrape(flow, Readiness(broker))))
    try:
        await eventually(lambda: flow.behind == 0)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await a.close()
        await b.close()
    assert registry.get_sample_value("reach_metrics_feed_lag_seconds") == 0.0


async def test_a_counting_consumer_made_with_acks_is_made_again_without(broker):
    """An older version made ``coordinator-metrics`` with explicit acks, which the server
    cannot change: a consumer that starts at new messages is made again."""
    names = broker.names
    explicit = ConsumerSpec(
        stream=names.events_stream,
        durable="counting-upgrade",
        filter_subjects=(names.events_wildcard,),
        new_only=True,
    )
    await (await bind(broker, explicit)).close()
    upgraded = await bind(broker, dataclasses.replace(explicit, acknowledged=False))
    await upgraded.close()
    state = await consumer_state(broker, names.events_stream, "counting-upgrade")
    assert state is not None and state.ack_policy == "none"


async def test_a_consumer_with_history_is_not_made_again_for_a_new_ack_policy(broker):
    names = broker.names
    kept = ConsumerSpec(
        stream=names.events_stream,
        durable="history-kept",
        filter_subjects=(names.events_wildcard,),
    )
    await (await bind(broker, kept)).close()
    with pytest.raises(BrokerError, match="ack policy can not be updated"):
        await bind(broker, dataclasses.replace(kept, acknowledged=False))
    state = await consumer_state(broker, names.events_stream, "history-kept")
    assert state is not None and state.ack_policy == "explicit"


async def test_a_message_handled_longer_than_the_ack_wait_is_not_delivered_again(broker):
    """The ack wait is short (what a dead replica held comes back soon), so a handling that
    outlasts it says it is in progress: the message is delivered once and settled once."""
    names = broker.names
    consumer = await _intake_consumer(broker, "kept-alive-test", ack_wait_s=0.4)
    handled: list[int] = []
    done = asyncio.Event()

    async def handle(delivery: Delivery) -> float | None:
        handled.append(delivery.num_delivered)
        await asyncio.sleep(1.5)  # the work itself: nearly four ack waits
        done.set()
        return None

    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    runner = asyncio.create_task(consumption.run(consumer, 8, handle))
    try:
        await broker.publish(names.task("echo"), b'"long"', headers={h.MSG_ID: "k-long"})
        await asyncio.wait_for(done.wait(), timeout=10.0)

        async def settled() -> bool:
            state = await consumer_state(broker, names.tasks_stream, "kept-alive-test")
            return state is not None and state.num_ack_pending == 0

        await until_true(settled, timeout=10.0)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await consumer.close()
    assert handled == [1]


async def test_a_message_wanted_back_at_its_last_delivery_is_ended_here(broker, watcher):
    """The server delivers a message `max_deliver` times at most. Its max-deliveries advisory
    ended it before, and a copy of an agent's own JSON could not be told from one: it ended
    other callers' waiting tasks and deleted workflow timers. The coordinator's consumers now
    end a message wanted back at their last delivery themselves."""
    names = broker.names
    consumer = await _intake_consumer(broker, "consumption-last", max_deliver=3)
    seen: list[int] = []

    async def handle(delivery: Delivery) -> float | None:
        seen.append(delivery.num_delivered)
        return 0.05  # waiting for an agent that never comes

    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    runner = asyncio.create_task(consumption.run(consumer, 8, handle))
    try:
        await broker.publish(names.task("echo"), b"not a task", headers={h.MSG_ID: "c-last"})
        letter = await watcher.dead_letter("retries_exhausted")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert seen == [1, 2, 3]
    assert letter.error is not None and letter.error.type == "max_deliveries"
    assert "delivered 3 times to consumption-last" in letter.error.message


def _counting(names: Names, durable: str) -> ConsumerSpec:
    """A consumer of every new event that acknowledges nothing, as the metrics' fold is."""
    return ConsumerSpec(
        stream=names.events_stream,
        durable=durable,
        filter_subjects=(names.events_wildcard,),
        new_only=True,
        acknowledged=False,
    )
