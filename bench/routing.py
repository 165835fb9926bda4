"""What the rule engine costs: one routing decision, and end-to-end throughput with it.

    .venv/bin/python bench/routing.py [--agents 1000] [--rules 100] [--tasks 3000]

Decision cost: the first matching rule (the last of ``--rules``, matched on a
payload field) plus the choice of an agent among ``--agents`` registered agents
(a tag selector admits a tenth of them), in memory, per decision. Throughput:
the whole path (publish → coordinator → agent → completed) with that table
against a single trivial rule, and raw nats-py publish → pull → ack, all in the
same run on the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time

import msgspec
from common import counting, nats_server
from e2e import baseline, publish_all

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.broker.watch import Change
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig
from agentreach.coordinator.routing.rules import RoutingConfig, pools_of
from agentreach.envelopes import AgentCard, Intent, Task

REGIONS = [f"region-{i}" for i in range(10)]


def rule_table(rules: int) -> RoutingConfig:
    """``rules - 2`` rules that never match, the real one, then the fallback."""
    table: list[dict[str, object]] = [
        {
            "name": f"miss-{i}",
            "match": {
                "topic": f"other_{i}*",
                "where": [{"field": "payload.amount", "op": ">=", "value": i}],
            },
            "to": {"intent": f"other_{i}"},
        }
        for i in range(max(0, rules - 2))
    ]
    table.append(
        {
            "name": "east",
            "match": {
                "topic": "work",
                "where": [{"field": "payload.region", "op": "in", "value": ["region-3"]}],
            },
            "to": {"tags": {"region": "region-3"}},
        }
    )
    table.append({"name": "fallback", "fallback": True, "to": {}})
    return msgspec.convert({"rules": table}, RoutingConfig)


def trivial_table() -> RoutingConfig:
    return msgspec.convert({"rules": [{"name": "all", "fallback": True, "to": {}}]}, RoutingConfig)


async def decision_cost(url: str, agents: int, rules: int, decisions: int = 20_000) -> float:
    """µs per decision (rule match + pools + agent choice), in memory."""
    async with Broker(url, names=Names(prefix="benchdecide"), name="bench-decide") as broker:
        coordinator = Coordinator(broker, CoordinatorConfig(routing=rule_table(rules)))
        directory = coordinator.directory
        for i in range(agents):
            card = AgentCard(
                agent_id=f"agent-{i}",
                intents={"work": Intent()},
                tags={"region": REGIONS[i % len(REGIONS)]},
            )
            directory._apply(Change(key=card.agent_id, value=envelopes.encode(card), revision=1))
        router, fleet = coordinator.router, coordinator.router.fleet
        task = Task(
            v=1,
            message_id="m",
            trace_id="t",
            topic="work",
            payload={"region": "region-3", "amount": 10},
        )
        random.seed(1)
        started = time.perf_counter()
        for _ in range(decisions):
            rule = router.routing.first_match(task)
            choice = fleet.choose(pools_of(rule.to, task.topic), task.priority, {})
            assert choice.agent is not None
        return (time.perf_counter() - started) / decisions * 1e6


async def throughput(url: str, routing: RoutingConfig, count: int, window: int, tag: str) -> float:
    """Tasks per second through the whole path with ``routing``, four agents."""
    names = Names(prefix=f"benchroute{tag}")
    fleet = [
        Agent(f"bench-{tag}-{i}", tags={"region": "region-3"}, startup_delay=0) for i in range(4)
    ]
    for agent in fleet:

        @agent.handler("work", capacity=128)
        async def work(ctx: TaskContext, payload: object) -> object:
            return None

    config = CoordinatorConfig(
        intake=IntakeConfig(batch=128), routing=routing, queues=QueueConfig(capacity={"P1": 4096})
    )
    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with contextlib.AsyncExitStack() as stack:
            done = await stack.enter_async_context(
                counting(broker, names.events_of_kind("completed"), count)
            )
            await stack.enter_async_context(Coordinator(broker, config).running())
            client = await stack.enter_async_context(
                ReachClient(url, names=names, name="bench-client")
            )
            for agent in fleet:
                await stack.enter_async_context(agent.running(url, names=names))
            payload = {"region": "region-3", "amount": 10}
            started = time.perf_counter()
            await publish_all(lambda i: client.publish("work", payload), count, window)
            await asyncio.wait_for(done.wait(), timeout=300)
            elapsed = time.perf_counter() - started
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rules", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--window", type=int, default=256, help="publishes in flight")
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs of each table")
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        with_rules = await decision_cost(url, args.agents, args.rules)
        one_rule = await decision_cost(url, args.agents, 2)
        raw = await baseline(url, args.tasks, args.window)
        engine, trivial = [], []
        for round_ in range(args.rounds):  # interleaved, so warm-up and drift hit both alike
            for routing, results in ((trivial_table(), trivial), (rule_table(args.rules), engine)):
                tag = f"{len(routing.rules)}r{round_}"
                results.append(await throughput(url, routing, args.tasks, args.window, tag))
    engine_mean, trivial_mean = statistics.mean(engine), statistics.mean(trivial)
    print(f"routing decision, {args.rules} rules, {args.agents} agents : {with_rules:8.1f} µs")
    print(f"routing decision, 1 rule + fallback, {args.agents} agents : {one_rule:8.1f} µs")
    print(f"tasks: {args.tasks}, publishes in flight: {args.window}, 4 agents")
    print(f"raw nats-py publish → pull → ack        : {raw:8.0f} msg/s")
    runs = f"(mean of {args.rounds}: {', '.join(f'{r:.0f}' for r in engine)})"
    print(f"agent-reach, {args.rules} rules                : {engine_mean:8.0f} tasks/s {runs}")
    runs = f"(mean of {args.rounds}: {', '.join(f'{r:.0f}' for r in trivial)})"
    print(f"agent-reach, one trivial rule           : {trivial_mean:8.0f} tasks/s {runs}")
    print(f"rules / trivial                         : {engine_mean / trivial_mean:8.1%}")
    print(f"rules / raw                             : {engine_mean / raw:8.1%}")


if __name__ == "__main__":
    asyncio.run(main())
