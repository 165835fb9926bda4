"""What replication and durability cost, and how long a failover interrupts the flow.

    .venv/bin/python bench/cluster.py [--publishes 2000] [--tasks 3000] [--failover-tasks 900]

Three profiles, each on a fresh 3-node JetStream cluster on loopback (three nats-server
processes, stores in a temporary directory):

- R1: every stream and bucket with one replica (the servers' default sync_interval, 2 min);
- R3: three replicas, same sync;
- R3 always: three replicas on servers running ``sync_interval: always`` (the durable profile:
  tasks, dispatch and DLQ placed on servers tagged sync:always).

For each: JetStream publishes to REACH_TASKS awaited one at a time and with 64 in flight, then
tasks per second through the whole path (publish → coordinator → agent no-op → completed).
Then one failover run (the cluster tests' harness): kill -9 the REACH_TASKS leader under
load, start it again, and print the election time, the longest gap without a completion and
the accounting. Numbers depend on the disks and CPUs: run it where you deploy.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.cluster

from common import counting

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, EmbeddedCluster, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig
from tests.cluster.failover import FailoverPlan, run_failover

# One agent takes every task: its queue must hold what is in flight.
CONFIG = CoordinatorConfig(
    intake=IntakeConfig(batch=128), queues=QueueConfig(capacity={"P1": 4096})
)
BODY = b'{"text": "' + b"x" * 240 + b'"}'  # about 256 bytes, a small task


@dataclass(frozen=True)
class Profile:
    label: str
    replicas: int
    sync: str
    work_tags: tuple[str, ...] = ()


PROFILES = (
    Profile("R1", 1, "2m"),
    Profile("R3", 3, "2m"),
    Profile("R3 sync always", 3, "always", ("sync:always",)),
)


@dataclass(frozen=True)
class Figures:
    one_at_a_time: float
    in_flight: float
    tasks: float


async def measure(profile: Profile, root: Path, publishes: int, tasks: int) -> Figures:
    names = Names(prefix="bench")
    topology = Topology.default(names, replicas=profile.replicas, work_tags=profile.work_tags)
    store = root / profile.label.replace(" ", "-")
    async with (
        EmbeddedCluster(3, store_dir=store, sync_interval=profile.sync) as cluster,
        Broker(cluster.url, names=names, name="bench") as broker,
    ):
        await provision(broker, topology)
        one = await publish_rate(broker, publishes // 4, window=1)
        many = await publish_rate(broker, publishes, window=64)
        await broker.js.purge_stream(names.tasks_stream)
        through = await reach_path(cluster.url, names, tasks, window=256)
    return Figures(one, many, through)


async def publish_rate(broker: Broker, count: int, *, window: int) -> float:
    """JetStream publishes to REACH_TASKS per second, ``window`` in flight."""
    subject = broker.names.task("bench")
    started = time.perf_counter()
    for start in range(0, count, window):
        await asyncio.gather(
            *(
                broker.publish(subject, BODY, headers={"Nats-Msg-Id": f"{window}-{i}"})
                for i in range(start, min(count, start + window))
            )
        )
    return count / (time.perf_counter() - started)


async def reach_path(url: str, names: Names, count: int, *, window: int) -> float:
    """Publish → coordinator → agent no-op → completed event observed, tasks per second."""
    agent = Agent("bench-noop", startup_delay=0)

    @agent.handler("noop", capacity=256)
    async def noop(ctx: TaskContext, payload: object) -> object:
        return None

    async with (
        Broker(url, names=names, name="bench-coordinator") as broker,
        counting(broker, names.events_of_kind("completed"), count) as done,
        Coordinator(broker, CONFIG).running(),
        agent.running(url, names=names),
        ReachClient(url, names=names, name="bench-client") as client,
    ):
        started = time.perf_counter()
        for start in range(0, count, window):
            batch = range(start, min(count, start + window))
            await asyncio.gather(*(client.publish("noop", {"n": i}) for i in batch))
        await asyncio.wait_for(done.wait(), timeout=600)
        return count / (time.perf_counter() - started)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=2000, help="per profile (64 in flight)")
    parser.add_argument("--tasks", type=int, default=3000, help="through the whole path")
    parser.add_argument("--failover-tasks", type=int, default=900, help="0: no failover run")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="reach-bench-cluster-"))
    try:
        figures = {}
        for profile in PROFILES:
            print(f"measuring {profile.label} ...", flush=True)
            figures[profile.label] = await measure(profile, root, args.publishes, args.tasks)
        report = None
        if args.failover_tasks:
            print("failover run ...", flush=True)
            plan = FailoverPlan(
                tasks=args.failover_tasks, kill_at_task=args.failover_tasks // 3, down_s=10.0
            )
            report = await run_failover(plan, root / "failover")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"3-node cluster on loopback; {args.publishes:,} publishes, {args.tasks:,} tasks")
    print(
        f"{'profile':<16} {'publish, 1 at a time':>22} {'publish, 64 in flight':>22}"
        f" {'tasks through reach':>20}"
    )
    base = figures["R1"]
    for label, f in figures.items():
        one = f"{f.one_at_a_time:>14,.0f} msg/s {_vs(f.one_at_a_time, base.one_at_a_time)}"
        many = f"{f.in_flight:>14,.0f} msg/s {_vs(f.in_flight, base.in_flight)}"
        print(f"{label:<16} {one} {many} {f.tasks:>12,.0f} tasks/s {_vs(f.tasks, base.tasks)}")
    if report is None:
        return 0
    print()
    print(f"failover: {report.figures()}")
    print(report.accounting.table())
    return 1 if report.problems() else 0


def _vs(value: float, base: float) -> str:
    return f"({value / base - 1:+4.0%})" if base else ""


if __name__ == "__main__":
    configure_logging("error")  # reconnect warnings during the failover are part of the plan
    sys.exit(asyncio.run(main()))
