"""Invoke latency on an idle system, against raw nats-py round trips on the same server.

    .venv/bin/python bench/invoke.py [--rounds 500]

Measured one at a time, in the same run:
- raw request/reply: core NATS request to a responder that answers at once;
- raw JetStream: publish to a stream → a pull consumer receives it and acks;
- Agent-Reach: ``ReachClient.invoke`` → coordinator → agent no-op → result.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import nats_server, percentile
from nats.js import api

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator


async def request_reply(url: str, rounds: int) -> list[float]:
    async with Broker(url, name="bench-rr") as broker:
        nc = broker.nc

        async def respond(msg) -> None:  # type: ignore[no-untyped-def]
            await msg.respond(msg.data)

        await nc.subscribe("bench.rr", cb=respond)
        return [await _timed(nc.request("bench.rr", b"{}", timeout=5)) for _ in range(rounds)]


async def jetstream_round_trip(url: str, rounds: int) -> list[float]:
    async with Broker(url, name="bench-js") as broker:
        js = broker.js
        await js.add_stream(api.StreamConfig(name="BENCH_RT", subjects=["bench.rt"]))
        sub = await js.pull_subscribe("bench.rt", durable="rt", stream="BENCH_RT")
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            fetch = asyncio.create_task(sub.fetch(1, timeout=5))
            await js.publish("bench.rt", b"{}")
            (msg,) = await fetch
            await msg.ack()
            samples.append(time.perf_counter() - started)
        await js.delete_stream("BENCH_RT")
        return samples


async def reach_invoke(url: str, rounds: int) -> list[float]:
    names = Names(prefix="benchinv")
    agent = Agent("bench-invoke", startup_delay=0)

    @agent.handler("noop")
    async def noop(ctx: TaskContext, payload: object) -> object:
        return payload

    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with (
            Coordinator(broker).running(),
            agent.running(url, names=names),
            ReachClient(url, names=names) as client,
        ):
            await client.invoke("noop", {})  # warm-up: consumers bound, caches filled
            return [await _timed(client.invoke("noop", {})) for _ in range(rounds)]


async def _timed(awaitable) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    await awaitable
    return time.perf_counter() - started


def _line(name: str, samples: list[float]) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    return f"{name:<34} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        rr = await request_reply(url, args.rounds)
        js = await jetstream_round_trip(url, args.rounds)
        invoke = await reach_invoke(url, args.rounds)
    print(f"rounds: {args.rounds}, one at a time")
    print(_line("raw nats-py request/reply", rr))
    print(_line("raw JetStream publish → consume", js))
    print(_line("agent-reach invoke", invoke))
    ratio_js = percentile(invoke, 99) / percentile(js, 99)
    ratio_rr = percentile(invoke, 99) / percentile(rr, 99)
    print(f"invoke p99 / JetStream p99         {ratio_js:6.2f}x   (target ≤ 3x)")
    print(f"invoke p99 / request-reply p99     {ratio_rr:6.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
