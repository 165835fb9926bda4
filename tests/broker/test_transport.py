"""A reconnect attempt that fails after its TCP connect is closed before the next one."""

from __future__ import annotations

import asyncio
import contextlib
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
            reconnecting = [
                t for t in asyncio.all_tasks() if "_attempt_reconnect" in repr(t.get_coro())
            ]
        finally:
            await broker.__aexit__(None, None, None)
            listener.close()
        # Closed as an attempt's TCP connect completes (here: as the listener takes it), the
        # reconnect loop swallowed its cancellation and went on connecting for ever.
        _, still_reconnecting = await asyncio.wait(reconnecting, timeout=5)
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == [], unclosed
    assert earlier_closed == [True] * (ATTEMPTS - 1)
    assert reconnecting and not still_reconnecting


async def test_a_cancelled_first_connect_closes_its_socket():
    """A caller that gives up on a connect (a test ending, a service stopping while it waits
    for NATS) cancels it mid-attempt: the client it was building kept its socket open."""
    arrived, closed_by_client = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived.set()
        await reader.read()  # until the client closes its side
        closed_by_client.set()
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        connecting = asyncio.create_task(Broker(f"nats://127.0.0.1:{port}").__aenter__())
        async with asyncio.timeout(10):
            await arrived.wait()  # the client waits for an INFO that never comes
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting
        async with asyncio.timeout(5):
            await closed_by_client.wait()
    finally:
        listener.close()
    assert connecting.cancelled()
