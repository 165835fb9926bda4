"""Invoke latency on an idle system, against raw nats-py round trips on the same server.

    .venv/bin/python bench/invoke.py [--rounds 500]
    .venv/bin/python bench/invoke.py --sporadic [--rounds 60]

Measured one at a time, in the same run:
- raw request/reply: core NATS request to a responder that answers at once;
- raw JetStream: publish to a stream → a pull consumer receives it and acks;
- Agent-Reach: ``ReachClient.invoke`` → coordinator → agent no-op → result.

``--sporadic`` is the shape of real agent work: each call follows a random quiet gap of
50-500 ms, alternating P0 and P1, with a raw JetStream round trip after its own gap in
between (interleaved, so both see the same machine). It prints p50, p99, max and the
calls slower than the round trip by more than 50 ms (stalls).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

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


@contextlib.asynccontextmanager
async def reach_stack(url: str, prefix: str) -> AsyncIterator[ReachClient]:
    """A coordinator, a no-op agent and a client on their own prefix."""
    names = Names(prefix=prefix)
    agent = Agent(f"{prefix}-agent", startup_delay=0)

    @agent.handler("noop")
    async def noop(ctx: TaskContext, payload: object) -> object:
        return payload

    async with Broker(url, names=names, name=f"{prefix}-coordinator") as broker:
        await provision(broker, Topology.default(names))
        async with (
            Coordinator(broker).running(),
            agent.running(url, names=names),
            ReachClient(url, names=names) as client,
        ):
            yield client


async def sporadic(url: str, rounds: int, seed: int) -> tuple[list[float], dict[str, list[float]]]:
    """Raw JetStream round trips and invokes at P0 and P1, each after a 50-500 ms gap."""
    rng = random.Random(seed)
    invokes: dict[str, list[float]] = {"P0": [], "P1": []}
    js_samples: list[float] = []
    async with Broker(url, name="bench-js-sporadic") as broker, reach_stack(url, "sporinv") as c:
        js = broker.js
        await js.add_stream(api.StreamConfig(name="BENCH_SPOR", subjects=["bench.spor"]))
        sub = await js.pull_subscribe("bench.spor", durable="spor", stream="BENCH_SPOR")
        # Not measured: the first call binds consumers and fills caches on both paths.
        await c.invoke("noop", {}, priority="P0")
        await c.invoke("noop", {}, priority="P1")
        for i in range(rounds):
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            started = time.perf_counter()
            fetch = asyncio.create_task(sub.fetch(1, timeout=5))
            await js.publish("bench.spor", b"{}")
            (msg,) = await fetch
            await msg.ack()
            js_samples.append(time.perf_counter() - started)
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            priority = "P0" if i % 2 == 0 else "P1"
            invokes[priority].append(await _timed(c.invoke("noop", {}, priority=priority)))
        await js.delete_stream("BENCH_SPOR")
    return js_samples, invokes


def _sporadic_line(name: str, samples: list[float], stall_s: float) -> str:
    stalls = sum(1 for s in samples if s > stall_s)
    return (
        f"{name:<34} p50 {percentile(samples, 50) * 1000:7.2f} ms   "
        f"p99 {percentile(samples, 99) * 1000:7.2f} ms   max {max(samples) * 1000:7.2f} ms   "
        f"stalls {stalls}/{len(samples)}"
    )


async def run_sporadic(url: str, rounds: int, seed: int) -> None:
    js, invokes = await sporadic(url, rounds, seed)
    both = invokes["P0"] + invokes["P1"]
    # A stall: slower than the round trip's p50 by more than 50 ms.
    stall_s = percentile(js, 50) + 0.050
    print(f"rounds: {rounds}, random gaps 50-500 ms, seed {seed}; stall = p50(JetStream) + 50 ms")
    print(_sporadic_line("raw JetStream publish → consume", js, stall_s))
    print(_sporadic_line("agent-reach invoke P0", invokes["P0"], stall_s))
    print(_sporadic_line("agent-reach invoke P1", invokes["P1"], stall_s))
    print(_sporadic_line("agent-reach invoke P0+P1", both, stall_s))
    ratio = percentile(both, 99) / percentile(js, 99)
    print(f"invoke p99 / JetStream p99         {ratio:6.2f}x   (target ≤ 3x, no stall)")


async def _timed(awaitable) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    await awaitable
    return time.perf_counter() - started


def _line(name: str, samples: list[float]) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    return f"{name:<34} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sporadic", action="store_true", help="random 50-500 ms gaps")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    configure_logging("warning", "console")
    if args.sporadic:
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        async with nats_server() as url:
            await run_sporadic(url, args.rounds or 60, seed)
        return
    args.rounds = args.rounds or 500
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
