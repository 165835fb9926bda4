"""A slot is a handler's: the next task waits in hand for it, and recording and reporting an
outcome hold none."""

from __future__ import annotations

import asyncio
import functools

import nats.errors
import pytest

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.agents.deadline import LEASE_GRACE_MS
from agentreach.agents.slots import HandlerPlaces
from agentreach.broker import consumer_state
from tests.support import until_true


async def test_the_next_task_waits_in_hand_for_the_slot_kept_alive_past_the_ack_wait(
    broker, coordinator
):
    """Capacity 1: a second task is delivered while the first runs, is not started until the
    first handler returns, and is not delivered again although it waits past the ack wait."""
    # 2 s: kept alive every second, which a busy machine's stall of the loop cannot outlast
    # (at 1 s, a CI run saw the waiting task handed out again).
    agent = Agent("hand-1", startup_delay=0, ack_wait=2.0)
    release = asyncio.Event()
    started: list[str] = []

    @agent.handler("hold", capacity=1)
    async def hold(ctx: TaskContext, payload: dict) -> dict:
        started.append(payload["n"])
        if payload["n"] == "first":
            await release.wait()
        return payload

    in_hand = functools.partial(_in_hand, broker, "hand-1")
    second_acks: list[object] = []
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        state = await consumer_state(broker, *_consumer_of(broker, "hand-1"))
        assert state is not None and state.spec.max_ack_pending == 2  # twice the capacity
        first = asyncio.create_task(client.invoke("hold", {"n": "first"}))
        await until_true(lambda: in_hand(1))
        second = asyncio.create_task(
            # Acknowledged when it starts (the ack says a slot took it), after the first.
            client.invoke(
                "hold", {"n": "second"}, on_ack=second_acks.append, ack_deadline_ms=30_000
            )
        )
        await until_true(lambda: in_hand(2))  # delivered while the first runs
        await asyncio.sleep(4.5)  # waiting past the ack wait is what this test is about
        # Kept alive: the server hands the waiting task to nobody else.
        stream, durable = _consumer_of(broker, "hand-1")
        thief = await broker.js.pull_subscribe_bind(durable, stream)
        with pytest.raises(nats.errors.TimeoutError):
            await thief.fetch(1, timeout=0.5)
        await thief.unsubscribe()
        assert started == ["first"]
        release.set()
        assert await first == {"n": "first"}
        assert await second == {"n": "second"}
    assert started == ["first", "second"]
    assert len(second_acks) == 1


async def test_a_stopping_agent_gives_back_the_task_that_waits_for_a_slot(broker, coordinator):
    """Stopping lets the running handler finish; the task waiting in hand, not started, goes
    back to the queue (for the next process) instead of being started during the drain."""
    agent = Agent("hand-2", startup_delay=0)
    release = asyncio.Event()
    started: list[str] = []

    @agent.handler("hold", capacity=1)
    async def hold(ctx: TaskContext, payload: dict) -> dict:
        started.append(payload["n"])
        await release.wait()
        return payload

    in_hand = functools.partial(_in_hand, broker, "hand-2")
    async with agent.running(broker=broker) as runtime, ReachClient(broker=broker) as client:
        await client.publish("hold", {"n": "first"})
        await until_true(lambda: in_hand(1))
        await client.publish("hold", {"n": "second"})
        await until_true(lambda: in_hand(2))
        stopping = asyncio.create_task(runtime.stop())
        release.set()
        await stopping
    assert started == ["first"]  # not started during the drain
    async with agent.running(broker=broker):  # not lost: the next process of the id runs it

        async def ran_again() -> bool:
            return started == ["first", "second"]

        await until_true(ran_again)


async def test_an_outcome_is_kept_before_the_accepted_event_is_waited_for(
    broker, coordinator, monkeypatch
):
    """The `accepted` publish can hang in an election after the handler has returned. The
    outcome is recorded first, so a redelivery that comes meanwhile (nothing keeps the
    delivery alive then), even past the claim's lease, answers and does not run it again."""
    from agentreach.agents.reports import Reports

    stuck = asyncio.Event()
    accept = Reports.accept

    async def stuck_accepting(self: Reports, job, *args) -> None:  # type: ignore[no-untyped-def]
        await accept(self, job, *args)
        if job.delivery.num_delivered == 1:
            await stuck.wait()  # the first delivery's accepted event is not acknowledged

    monkeypatch.setattr(Reports, "accept", stuck_accepting)
    agent = Agent("hand-3", startup_delay=0, ack_wait=0.5)
    runs: list[int] = []

    @agent.handler("once", capacity=1, deadline_ms=100)
    async def once(ctx: TaskContext, payload: dict) -> dict:
        runs.append(ctx.attempt)
        return {"ok": True}

    stream, durable = _consumer_of(broker, "hand-3")

    async def redelivered() -> bool:  # one message: a second delivery is a redelivery
        info = await broker.js.consumer_info(stream, durable)
        return (info.delivered.consumer_seq or 0) >= 2

    settled = functools.partial(_in_hand, broker, "hand-3", 0)

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        assert await client.invoke("once", {}) == {"ok": True}
        await until_true(redelivered)
        await asyncio.sleep((100 + LEASE_GRACE_MS) / 1000)  # past the claim's lease
        stuck.set()
        await until_true(settled)
    assert runs == [1]


def _consumer_of(broker, agent_id: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    names = broker.names
    return names.dispatch_stream("P1"), names.agent_consumer(agent_id, "P1")


async def _in_hand(broker, agent_id: str, count: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the agent's P1 consumer has ``count`` deliveries unacknowledged."""
    state = await consumer_state(broker, *_consumer_of(broker, agent_id))
    return state is not None and state.num_ack_pending == count


async def test_p1_and_p2_never_take_a_handlers_last_place() -> None:
    """With two places or more, a P1/P2 backlog leaves one for P0 (priority isolation
    within one handler's hard limit); with one place there is nothing to keep."""
    places = HandlerPlaces(2)
    await places.take("P2")
    late = asyncio.create_task(places.take("P2"))
    await asyncio.sleep(0)
    assert not late.done() and places.free == 1  # the last place is kept for P0
    assert (places.free_to("P2"), places.free_to("P1"), places.free_to("P0")) == (0, 0, 1)
    await places.take("P0")  # at once, without waiting for the P2 to end
    assert places.free == 0
    places.give()  # the P0 ends: still the last place, still not for P2
    await asyncio.sleep(0)
    assert not late.done()
    places.give()  # the first P2 ends: now one may run
    await asyncio.wait_for(late, 1)
    single = HandlerPlaces(1)
    await single.take("P2")
    assert single.free == 0


async def test_a_free_place_is_taken_at_once_unless_a_task_waits_or_it_is_kept_for_p0() -> None:
    """The path every task takes when the agent has room makes no wait of its own; a task
    that arrives while another waits queues behind it, even if a place is free to it."""
    places = HandlerPlaces(3)
    assert places.try_take("P1") and places.try_take("P1")
    assert not places.try_take("P2")  # the last place is P0's
    assert places.busy == 2
    waiting_p1 = asyncio.create_task(places.take("P1"))
    await asyncio.sleep(0)
    assert not waiting_p1.done()
    places.give()  # the freed place goes to the P1 that waits, not to a newcomer
    assert not places.try_take("P1")
    await asyncio.wait_for(waiting_p1, 1)
    assert places.try_take("P0") and places.free == 0
