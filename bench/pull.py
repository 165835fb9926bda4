"""The stall of sporadic traffic at its root: a pull consumer fed one message now and then.

    .venv/bin/python bench/pull.py [--messages 80] [--seed N]

Two consumers of one stream, side by side on the same server and the same messages (each
message is published once and read by both, through two durables): nats-py's
``fetch(64, timeout=1)`` in a loop, as the coordinator used to read, and
:class:`agentreach.broker.pull.Puller` (what every Agent-Reach consumer reads with now).
Messages follow random 50 ms - 1.5 s gaps. Printed: the time from publish to a consumer's
hands, p50 / p99 / max, and the stalls (slower than 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from common import nats_server, percentile
from nats.js import api

from agentreach.broker import Broker
from agentreach.broker.pull import Puller

STREAM, SUBJECT = "BENCH_PULL", "bench.pull"
STALL_S = 0.050


async def fetch_loop(sub, arrived: dict[bytes, float], stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    while not stop.is_set():
        try:
            for msg in await sub.fetch(64, timeout=1.0):
                arrived[msg.data] = time.perf_counter()
                await msg.ack()
        except TimeoutError:
            continue


async def puller_loop(puller: Puller, arrived: dict[bytes, float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for msg in await puller.fetch(64, wait_s=1.0):
            arrived[msg.data] = time.perf_counter()
            await msg.ack()


def line(name: str, delays: list[float]) -> str:
    stalls = sum(1 for d in delays if d > STALL_S)
    return (
        f"{name:<28} p50 {percentile(delays, 50) * 1000:7.2f} ms   "
        f"p99 {percentile(delays, 99) * 1000:7.2f} ms   max {max(delays) * 1000:7.2f} ms   "
        f"stalls {stalls}/{len(delays)}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=80)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    async with nats_server() as url, Broker(url, name="bench-pull") as broker:
        js = broker.js
        await js.add_stream(api.StreamConfig(name=STREAM, subjects=[SUBJECT]))
        for durable in ("fetch", "puller"):
            await js.add_consumer(STREAM, api.ConsumerConfig(durable_name=durable, ack_wait=30))
        sub = await js.pull_subscribe_bind(durable="fetch", stream=STREAM)
        puller = await Puller(broker, STREAM, "puller").open()
        by_fetch: dict[bytes, float] = {}
        by_puller: dict[bytes, float] = {}
        sent: dict[bytes, float] = {}
        stop = asyncio.Event()
        loops = [
            asyncio.create_task(fetch_loop(sub, by_fetch, stop)),
            asyncio.create_task(puller_loop(puller, by_puller, stop)),
        ]
        await asyncio.sleep(0.5)  # both loops are waiting
        for n in range(args.messages):
            await asyncio.sleep(rng.uniform(0.05, 1.5))
            body = str(n).encode()
            sent[body] = time.perf_counter()
            await js.publish(SUBJECT, body)
        async with asyncio.timeout(5):
            while len(by_fetch) < len(sent) or len(by_puller) < len(sent):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait(loops, timeout=3)
        await puller.close()
        await js.delete_stream(STREAM)
    print(f"messages: {args.messages}, random gaps 50 ms - 1.5 s, seed {seed}")
    print(line("nats-py fetch(64, 1 s) loop", [by_fetch[b] - t for b, t in sent.items()]))
    print(line("Puller (agentreach.broker)", [by_puller[b] - t for b, t in sent.items()]))


if __name__ == "__main__":
    asyncio.run(main())
