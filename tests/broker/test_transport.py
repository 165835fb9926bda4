"""A reconnect attempt that fails after its TCP connect is closed before the next one."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path

from agentreach.broker import Broker, EmbeddedServer

ATTEMPTS = 3


async def test_a_failed_reconnect_attempt_leaves_no_stream_open(tmp_path: Path):
    """A server that takes the connection and says nothing (a hung host, a node shutting
    down): nats-py's reconnect loop opened the next attempt over the last one's stream and
    never closed it. Collected later, in another event loop, it left a ResourceWarning
    ("loop is closed"), its transport and its socket open (a CI run failed on the three)."""
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "store") as server:
        port = server.port
        broker = Broker(server.url, connect_timeout=0.3)
        await broker.__aenter__()
    attempts: list[asyncio.StreamReader] = []
    enough = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempts.append(reader)
        if len(attempts) >= ATTEMPTS:
            enough.set()
        await reader.read()  # until the client closes its side
        writer.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        listener = await asyncio.start_server(silent, "127.0.0.1", port)
        try:
            async with asyncio.timeout(30):
                await enough.wait()
            earlier_closed = [reader.at_eof() for reader in attempts[: ATTEMPTS - 1]]
        finally:
            await broker.__aexit__(None, None, None)
            listener.close()
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == [], unclosed
    assert earlier_closed == [True] * (ATTEMPTS - 1)
