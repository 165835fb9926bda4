"""`reach_tasks_held`: tasks a replica holds back because no agent of their topic can take
them, by topic — what a stranded topic looks like while other topics flow."""

from __future__ import annotations

from agentreach.agents import Agent, ReachClient, TaskContext
from tests.coordinator.observability.test_metrics import replica
from tests.scrape import scrape, total
from tests.support import Watcher, until_true


async def test_a_topic_whose_agents_are_gone_shows_its_held_tasks_while_others_flow(
    broker, watcher: Watcher
):
    strand, flow = Agent("held-strand", startup_delay=0), Agent("held-flow", startup_delay=0)

    @strand.handler("strand")
    async def stranded(ctx: TaskContext, payload: dict) -> dict:
        return {}

    @flow.handler("flow")
    async def flowing(ctx: TaskContext, payload: dict) -> dict:
        return {}

    async with replica(broker) as coordinator, flow.running(broker=broker):
        async with strand.running(broker=broker):
            await watcher.state("held-strand", "ONLINE")
        await watcher.state("held-strand", "OFFLINE")  # stopped: its card stays
        async with ReachClient(broker=broker) as client:
            for _ in range(2):
                await client.publish("strand", {}, ttl_ms=60_000)
            assert await client.invoke("flow", {}) == {}  # another topic flows

            async def held() -> dict | None:
                found = await scrape(coordinator.metrics_url)
                return found if total(found, "reach_tasks_held", topic="strand") == 2 else None

            found = await until_true(held)
    assert total(found, "reach_tasks_held", topic="flow") == 0
