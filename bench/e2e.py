"""Tasks per second through the whole Agent-Reach path, against raw nats-py on the same server.

    .venv/bin/python bench/e2e.py [--tasks 5000] [--window 256]

Reach path: publish a task → coordinator routes → agent runs a no-op handler →
``completed`` event observed; then, apart from the measured phase, the time until every
task's audit record is written (the audit writer runs behind). Baseline, measured in the
same run on the same server: publish to one stream, pull-consume in batches, ack. Both
publish with the same number of publishes in flight. Uses an embedded nats-server on a
free loopback port unless NATS_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import counting, nats_server
from nats.js import api

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig

# One agent takes every task: its queue must hold what is in flight, or the run measures
# backpressure rejections instead of throughput.
CONFIG = CoordinatorConfig(
    intake=IntakeConfig(batch=128), queues=QueueConfig(capacity={"P1": 4096})
)


async def publish_all(publish, count: int, window: int) -> None:  # type: ignore[no-untyped-def]
    """Keep ``window`` publishes in flight until ``count`` are acknowledged."""
    for start in range(0, count, window):
        await asyncio.gather(*(publish(i) for i in range(start, min(count, start + window))))


def rss_mib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


class Phase:
    """Wall time, this process's CPU time and RSS over one measured phase."""

    def __enter__(self) -> Phase:
        self.rss_before = rss_mib()
        self.started, self._cpu = time.perf_counter(), time.process_time()
        return self

    audited_s = 0.0

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.started
        self.cpu_s = time.process_time() - self._cpu
        self.rss_after = rss_mib()


async def baseline(url: str, count: int, window: int) -> Phase:
    """Raw nats-py: JetStream publish, pull-consume in batches of 100, ack."""
    async with Broker(url, name="bench-baseline") as broker:
        js = broker.js
        await js.add_stream(
            api.StreamConfig(
                name="BENCH", subjects=["bench.>"], retention=api.RetentionPolicy.WORK_QUEUE
            )
        )
        sub = await js.pull_subscribe("bench.x", durable="bench", stream="BENCH")
        body = b'{"n": 1}'

        async def consume() -> None:
            seen = 0
            while seen < count:
                try:
                    messages = await sub.fetch(100, timeout=1)
                except TimeoutError:
                    continue
                for msg in messages:
                    await msg.ack()
                seen += len(messages)

        with Phase() as phase:
            consumer = asyncio.create_task(consume())
            await publish_all(lambda i: js.publish("bench.x", body), count, window)
            await consumer
        await js.delete_stream("BENCH")
    return phase


async def reach_path(url: str, count: int, window: int) -> Phase:
    """Publish → coordinator → agent no-op → completed event observed."""
    names = Names(prefix="bench")
    agent = Agent("bench-noop", startup_delay=0)

    @agent.handler("noop", capacity=256)
    async def noop(ctx: TaskContext, payload: object) -> object:
        return None

    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with (
            counting(broker, names.events_of_kind("completed"), count) as done,
            # The audit writer runs behind the completions: timed apart, after the phase.
            counting(broker, names.audit_wildcard, count) as audited,
            Coordinator(broker, CONFIG).running(),
            agent.running(url, names=names),
            ReachClient(url, names=names, name="bench-client") as client,
        ):
            with Phase() as phase:
                await publish_all(lambda i: client.publish("noop", {"n": i}), count, window)
                await asyncio.wait_for(done.wait(), timeout=300)
            await asyncio.wait_for(audited.wait(), timeout=300)
            phase.audited_s = time.perf_counter() - phase.started
    return phase


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--window", type=int, default=256, help="publishes in flight")
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        raw = await baseline(url, args.tasks, args.window)
        reach = await reach_path(url, args.tasks, args.window)
    n = args.tasks
    raw_rate, reach_rate = n / raw.elapsed, n / reach.elapsed
    print(f"tasks: {n}, publishes in flight: {args.window}")
    print(f"raw nats-py  publish → pull → ack : {raw_rate:9.0f} msg/s")
    print(f"agent-reach  publish → completed  : {reach_rate:9.0f} tasks/s")
    print(f"ratio reach / raw                 : {reach_rate / raw_rate:9.1%}")
    print(
        f"every audit record written after  : {reach.audited_s:9.2f} s"
        f" ({n / reach.audited_s:.0f} tasks/s publish → audited)"
    )
    print(
        f"Python CPU per message / task     : raw {raw.cpu_s / n * 1e3:.3f} ms,"
        f" reach {reach.cpu_s / n * 1e3:.3f} ms (client, coordinator and agent together)"
    )
    print(
        f"RSS over the reach run            : {reach.rss_before:.0f} → {reach.rss_after:.0f} MiB"
        f" ({(reach.rss_after - reach.rss_before) / n * 1024:+.1f} KiB per task)"
    )


if __name__ == "__main__":
    asyncio.run(main())
