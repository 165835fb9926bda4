"""Helpers of the routing and protection scenarios: configs, fleets of agents, traffic."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker
from agentreach.coordinator import Coordinator, CoordinatorConfig
from agentreach.coordinator.routing.rules import RoutingConfig
from agentreach.envelopes import Event
from tests.conftest import FAST
from tests.support import Watcher, eventually

ONE_ATTEMPT = msgspec.structs.replace(FAST.delivery, max_attempts=1)


def fast(**changes: Any) -> CoordinatorConfig:
    """The tests' fast config with ``changes``."""
    return msgspec.structs.replace(FAST, **changes)


def table(yaml: str) -> RoutingConfig:
    return msgspec.yaml.decode(yaml.encode(), type=RoutingConfig)


def worker(
    agent_id: str,
    counts: Counter[str],
    *,
    tags: dict[str, str] | None = None,
    topics: Iterable[str] = ("work",),
    **options: Any,
) -> Agent:
    """An agent that counts, per agent id, the tasks it ran, and answers with its id."""
    agent = Agent(agent_id, tags=tags or {}, startup_delay=0, **options)

    async def handle(ctx: TaskContext, payload: Any) -> dict[str, str]:
        counts[agent_id] += 1
        return {"by": agent_id}

    for topic in topics:
        agent.handler(topic, capacity=50)(handle)
    return agent


@contextlib.asynccontextmanager
async def serving(broker: Broker, coordinator: Coordinator, *agents: Agent) -> AsyncIterator[None]:
    """Run ``agents`` until the block ends, once the coordinator knows every one of them."""
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            await stack.enter_async_context(agent.running(broker=broker))
        # Running by the coordinator's view: a card of an earlier run of the id (stopped)
        # on the same server counted as known, and the agent was passed over as stopped.
        directory = coordinator.directory
        await eventually(
            lambda: all(
                (card := directory.cards.get(a.agent_id)) and directory.can_take_work(card)
                for a in agents
            )
        )
        yield


async def publish_many(client: ReachClient, topic: str, n: int, **options: Any) -> set[str]:
    """Publish ``n`` tasks (100 at a time); their message ids."""
    ids: set[str] = set()
    for start in range(0, n, 100):
        sent = await asyncio.gather(
            *(client.publish(topic, {"i": i}, **options) for i in range(start, min(n, start + 100)))
        )
        ids.update(message_id for message_id, _ in sent)
    return ids


async def all_completed(watcher: Watcher, ids: set[str], timeout: float = 30.0) -> None:
    await watcher.until(
        lambda: True if watcher.count("completed", ids) >= len(ids) else None,
        f"{len(ids)} completed",
        timeout,
    )


def routed(watcher: Watcher, ids: set[str] | None = None) -> list[Event]:
    return [
        e for e in watcher.events if e.event == "routed" and (ids is None or e.message_id in ids)
    ]
