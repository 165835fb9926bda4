"""Shared pieces of the benchmarks: a server for the run and percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
from collections.abc import AsyncIterator

from agentreach.broker import Broker, EmbeddedServer


@contextlib.asynccontextmanager
async def nats_server() -> AsyncIterator[str]:
    """``$NATS_URL``, or an embedded nats-server on a free loopback port for the run."""
    if url := os.environ.get("NATS_URL"):
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="reach-bench-") as store:
        async with EmbeddedServer(port=-1, store_dir=store) as server:
            yield server.url


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``samples``."""
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


@contextlib.asynccontextmanager
async def counting(broker: Broker, subject: str, count: int) -> AsyncIterator[asyncio.Event]:
    """An event that is set once ``count`` messages have arrived on ``subject``."""
    done, seen = asyncio.Event(), 0

    async def arrived(msg: object) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    subscription = await broker.nc.subscribe(subject, cb=arrived)
    try:
        yield done
    finally:
        await subscription.unsubscribe()
