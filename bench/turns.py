"""What one invoke costs the Python process: event-loop callbacks, socket writes, CPU.

    .venv/bin/python bench/turns.py [--rounds 300]

On a small machine an invoke is bound by CPU, not by the network: each callback the event
loop runs costs tens of microseconds, and each socket write wakes nats-server (on two vCPUs,
often on the writer's own core). This counts, over invokes run one at a time through a
coordinator and a no-op agent in this process (as in ``invoke.py``): the loop's callbacks,
the writes to sockets, the Python CPU time and nats-server's. The raw JetStream round trip
(publish → pull → ack, nats-py) is counted the same way in the same run, as the unit.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import asyncio.selector_events
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common import nats_server, percentile
from invoke import reach_stack
from nats.js import api

from agentreach.broker import Broker
from agentreach.cli.logs import configure_logging


@dataclass
class Counts:
    callbacks: int = 0
    writes: int = 0


COUNTS = Counts()
_run, _write = asyncio.events.Handle._run, asyncio.selector_events._SelectorSocketTransport.write


def _counted_run(self: asyncio.events.Handle) -> None:
    COUNTS.callbacks += 1
    _run(self)


def _counted_write(self: asyncio.selector_events._SelectorSocketTransport, data: bytes) -> None:
    COUNTS.writes += 1
    _write(self, data)


asyncio.events.Handle._run = _counted_run  # type: ignore[method-assign]
asyncio.selector_events._SelectorSocketTransport.write = _counted_write  # type: ignore[method-assign]


def server_cpu_s() -> float:
    """The CPU time of the embedded nats-server (this process's child); NaN for another."""
    pids = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "nats-server"], capture_output=True, text=True
    ).stdout.split()
    if not pids:
        return float("nan")
    with open(f"/proc/{pids[0]}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Measure:
    samples: list[float]
    callbacks: float
    writes: float
    cpu_ms: float
    server_cpu_ms: float

    def line(self, name: str) -> str:
        return (
            f"{name:<32} p50 {percentile(self.samples, 50) * 1000:6.2f} ms  "
            f"callbacks {self.callbacks:6.1f}  writes {self.writes:5.1f}  "
            f"CPU {self.cpu_ms:5.2f} ms  server CPU {self.server_cpu_ms:5.2f} ms"
        )


async def measured(url: str, rounds: int, one: Callable[[], Awaitable[object]]) -> Measure:
    samples = []
    COUNTS.callbacks = COUNTS.writes = 0
    cpu, server = time.process_time(), server_cpu_s()
    for _ in range(rounds):
        started = time.perf_counter()
        await one()
        samples.append(time.perf_counter() - started)
    return Measure(
        samples,
        COUNTS.callbacks / rounds,
        COUNTS.writes / rounds,
        (time.process_time() - cpu) / rounds * 1000,
        (server_cpu_s() - server) / rounds * 1000,
    )


async def jetstream(url: str, rounds: int) -> Measure:
    async with Broker(url, name="bench-turns-js") as broker:
        js = broker.js
        await js.add_stream(api.StreamConfig(name="BENCH_TURNS", subjects=["bench.turns"]))
        sub = await js.pull_subscribe("bench.turns", durable="turns", stream="BENCH_TURNS")

        async def round_trip() -> None:
            fetch = asyncio.create_task(sub.fetch(1, timeout=5))
            await js.publish("bench.turns", b"{}")
            (msg,) = await fetch
            await msg.ack()

        await round_trip()
        return await measured(url, rounds, round_trip)


async def reach(url: str, rounds: int) -> Measure:
    async with reach_stack(url, "turns") as client:
        for _ in range(5):  # consumers bound, caches filled
            await client.invoke("noop", {})
        return await measured(url, rounds, lambda: client.invoke("noop", {}))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    configure_logging("warning", "console")
    async with nats_server() as url:
        raw = await jetstream(url, args.rounds)
        invoke = await reach(url, args.rounds)
    print(f"rounds: {args.rounds}, one at a time; per round trip / per invoke")
    print(raw.line("raw JetStream publish → consume"))
    print(invoke.line("agent-reach invoke"))
    print(
        f"invoke / round trip: callbacks {invoke.callbacks / raw.callbacks:.1f}x, "
        f"writes {invoke.writes / raw.writes:.1f}x, CPU {invoke.cpu_ms / raw.cpu_ms:.1f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
