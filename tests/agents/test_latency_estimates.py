"""The latency an ``ack`` advertises is its topic's: the moving average of the runs of the
handler that accepted the task, not of every handler of the agent together."""

from __future__ import annotations

import asyncio

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.agents.slots import Latencies
from agentreach.envelopes import Ack

SLOW_MS = 300


def test_each_topic_has_its_own_moving_average_and_the_heartbeat_all_of_them():
    """Runs of two topics: each topic's estimate averages its own runs only; the agent's
    (its heartbeat's load) averages every run; a topic not run yet is 0."""
    latencies = Latencies(weight=0.5)
    for topic, ms in (("slow", 400), ("fast", 4), ("slow", 200), ("fast", 6)):
        latencies.observe(topic, ms)
    assert latencies.of("slow") == 300
    assert latencies.of("fast") == 5
    assert latencies.of("never") == 0
    assert latencies.estimate_ms == 103  # 400, then halfway to 4 (202), to 200 (201), to 6


async def test_an_agent_with_a_fast_and_a_slow_topic_acks_each_with_its_own_estimate(
    broker, coordinator
):
    """A 300 ms topic beside an instant one, run in turn: an ack of the fast topic says
    (nearly) 0 though the slow one ran just before it, and an ack of the slow topic says at
    least 300 ms though fast runs came between (a mix of the two said ~240 and ~190)."""
    agent = Agent("latency-1", startup_delay=0)

    @agent.handler("slow_report")
    async def slow_report(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(SLOW_MS / 1000)  # the length of the work is what is measured
        return {}

    @agent.handler("quick_lookup")
    async def quick_lookup(ctx: TaskContext, payload: dict) -> dict:
        return {}

    acks: dict[str, list[int]] = {"slow_report": [], "quick_lookup": []}

    def on_ack_of(topic: str):  # type: ignore[no-untyped-def]
        def on_ack(ack: Ack) -> None:
            assert ack.capacity is not None
            acks[topic].append(ack.capacity.est_latency_ms)

        return on_ack

    order = ["slow_report", "quick_lookup", "quick_lookup", "slow_report"]
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        for topic in order:
            await client.invoke(topic, {}, on_ack=on_ack_of(topic))
    assert acks["slow_report"][0] == 0  # before its first run
    assert acks["quick_lookup"][0] < 50 and acks["quick_lookup"][1] < 50
    assert acks["slow_report"][1] >= SLOW_MS - 10  # a timer may end a hair early, rounded down
