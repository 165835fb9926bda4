"""One wide fan-out: the time from its start to its end, against its branches run as tasks.

    .venv/bin/python bench/fanout.py [--branches 300] [--rounds 2]

Every branch's result rewrites the instance's one record, so a wide fan-out's branches
contend for it; the baseline, in the same run on the same server, is the same number of
no-op tasks sent at once (publish → completed), and raw nats-py publish → pull → ack.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import counting, nats_server
from e2e import baseline
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig
from agentreach.coordinator import workflow as wf


async def seconds(url: str, branches: int, *, wide: bool, label: str) -> tuple[float, int]:
    """How long ``branches`` no-op tasks took, as one fan-out or sent at once, and how many
    writes of the record lost every race they tried."""
    names = Names(prefix=f"benchfan{label}")
    flow = wf.fanout([wf.step(f"b{i}", "noop") for i in range(branches)])
    config = CoordinatorConfig(
        intake=IntakeConfig(batch=128),
        queues=QueueConfig(capacity={"P1": 8192}),
        workflows={"wide": flow},
    )
    agent = Agent("bench-fan", startup_delay=0)

    @agent.handler("noop", capacity=64)
    async def noop(ctx: TaskContext, payload: object) -> object:
        return payload

    ending, count = ("workflow_completed", 1) if wide else ("completed", branches)
    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with (
            counting(broker, names.events_of_kind(ending), count) as done,
            Coordinator(broker, config).running(),
            agent.running(url, names=names),
            ReachClient(url, names=names, name="bench-client") as client,
        ):
            with capture_logs() as logs:
                started = time.perf_counter()
                if wide:
                    await client.publish("wide", {"n": 0})
                else:
                    await asyncio.gather(*(client.publish("noop", {"n": i}) for i in range(count)))
                await asyncio.wait_for(done.wait(), timeout=600)
                elapsed = time.perf_counter() - started
    lost = sum("changed under us" in str(e.get("error", "")) for e in logs)
    return elapsed, lost


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        raw = await baseline(url, args.branches, 64)
        print(f"branches: {args.branches}, 1 no-op agent of capacity 64")
        print(f"raw nats-py publish → pull → ack : {raw.elapsed * 1000:8.0f} ms")
        for n in range(args.rounds):
            tasks, _ = await seconds(url, args.branches, wide=False, label=f"t{n}")
            fan, lost = await seconds(url, args.branches, wide=True, label=f"f{n}")
            print(
                f"round {n + 1}: {args.branches} tasks {tasks * 1000:6.0f} ms;"
                f" one fan-out {fan * 1000:6.0f} ms ({fan / tasks:4.1f}x the tasks,"
                f" {fan / raw.elapsed:5.1f}x raw); record writes that lost every race: {lost}"
            )


if __name__ == "__main__":
    asyncio.run(main())
