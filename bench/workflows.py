"""Completed workflows per second: a three-step chain and a three-branch fan-out.

    .venv/bin/python bench/workflows.py [--workflows 300] [--window 64]

No-op agents; ``--window`` workflows in flight. The baseline, in the same run on
the same server, is Agent-Reach's own single-task path (publish → completed),
since a three-step workflow is at least three such tasks, plus raw nats-py
publish → pull → ack.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import counting, nats_server
from e2e import baseline, publish_all

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig
from agentreach.coordinator import workflow as wf

SHAPES = {
    "single task": None,
    "3-step chain": wf.chain(wf.step("a", "noop"), wf.step("b", "noop"), wf.step("c", "noop")),
    "3-branch fan-out": wf.fanout(
        [wf.step("a", "noop"), wf.step("b", "noop"), wf.step("c", "noop")]
    ),
}


async def rate(url: str, label: str, count: int, window: int) -> float:
    """Workflows (or single tasks) completed per second."""
    names = Names(prefix=f"benchwf{len(label)}")
    spec = SHAPES[label]
    config = CoordinatorConfig(
        intake=IntakeConfig(batch=128),
        queues=QueueConfig(capacity={"P1": 8192}),
        workflows={"flow": spec} if spec else {},
    )
    agents = [Agent(f"bench-noop-{i}", startup_delay=0) for i in range(2)]
    for agent in agents:

        @agent.handler("noop", capacity=128)
        async def noop(ctx: TaskContext, payload: object) -> object:
            return payload

    topic, ending = ("flow", "workflow_completed") if spec else ("noop", "completed")
    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with (
            counting(broker, names.events_of_kind(ending), count) as done,
            Coordinator(broker, config).running(),
            agents[0].running(url, names=names),
            agents[1].running(url, names=names),
            ReachClient(url, names=names, name="bench-client") as client,
        ):
            started = time.perf_counter()
            await publish_all(lambda i: client.publish(topic, {"n": i}), count, window)
            await asyncio.wait_for(done.wait(), timeout=600)
            elapsed = time.perf_counter() - started
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--window", type=int, default=64, help="workflows in flight")
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        measured = await baseline(url, args.workflows * 3, args.window)
        raw = args.workflows * 3 / measured.elapsed  # baseline() returns its Phase: msg/s here
        rates = {label: await rate(url, label, args.workflows, args.window) for label in SHAPES}
    print(f"workflows: {args.workflows}, in flight: {args.window}, 2 no-op agents")
    print(f"raw nats-py publish → pull → ack : {raw:8.0f} msg/s")
    single = rates["single task"]
    for label, value in rates.items():
        unit = "tasks/s" if label == "single task" else "workflows/s"
        steps = 1 if label == "single task" else 3
        print(
            f"{label:<17}: {value:8.1f} {unit:<11} ({value * steps:5.0f} step tasks/s:"
            f" {value * steps / single:6.1%} of single tasks, {value * steps / raw:5.1%} of raw)"
        )


if __name__ == "__main__":
    asyncio.run(main())
