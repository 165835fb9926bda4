"""Long-running commands: the optional embedded server, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import structlog

from agentreach.broker import Broker, EmbeddedServer, Names, Topology, provision
from agentreach.envelopes import Priority

log = structlog.get_logger("reach")


@contextlib.asynccontextmanager
async def nats_server(url: str | None, *, port: int, data_dir: Path) -> AsyncIterator[str]:
    """``url`` when one was given; otherwise an embedded nats-server for the block."""
    if url:
        yield url
        return
    async with EmbeddedServer(port=port, store_dir=data_dir) as server:
        yield server.url


@contextlib.asynccontextmanager
async def provisioned(
    url: str, names: Names, *, name: str, queue_capacity: Mapping[Priority, int] | None = None
) -> AsyncIterator[Broker]:
    """A connection whose streams and buckets exist (provisioning is idempotent)."""
    async with Broker(url, names=names, name=name) as broker:
        await provision(broker.js, Topology.default(names, queue_capacity=queue_capacity))
        yield broker


async def until_signal(announce: str) -> None:
    """Print ``announce`` once Ctrl-C is caught, then return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"reach: {announce} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        await stop.wait()
        log.info("stopping")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
