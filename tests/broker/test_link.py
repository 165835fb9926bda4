"""What a connection's callbacks say: the same asynchronous error again and again is one line
a minute, with how often it came meanwhile; and when it came back from a server it could not
reach."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from agentreach.broker import Broker, EmbeddedServer
from tests.chaos.processes import free_port
from tests.e2e.test_startup_and_restarts import RestartableServer
from tests.support import eventually


def errors_in(logs: list[dict]) -> list[dict]:
    return [line for line in logs if line["event"] == "nats error"]


async def test_a_flood_of_one_error_is_said_once(broker):
    """A subscriber too slow for its messages makes nats-py report every dropped message
    (as it does every failed KV watch re-creation while a cluster has no majority): one
    warning names it, not one per message."""
    taken = asyncio.Event()

    async def stuck(msg):
        taken.set()
        await asyncio.Event().wait()

    sub = await broker.nc.subscribe("flood.test", cb=stuck, pending_msgs_limit=1)
    with capture_logs() as logs:
        for n in range(50):
            await broker.nc.publish("flood.test", str(n).encode())
        await broker.nc.flush()
        await asyncio.wait_for(taken.wait(), 5)
        # nats-py reports each drop from a task of its own: wait for them, not for luck
        await eventually(lambda: len(errors_in(logs)) >= 40)
    await sub.unsubscribe()
    warnings = errors_in(logs)
    assert len(warnings) >= 40, logs  # the flood reached the callback ...
    said = [line for line in warnings if line["log_level"] == "warning"]
    assert len(said) == 1, said  # ... and was said once
    assert "slow consumer" in said[0]["error"]


async def test_it_knows_when_it_came_back_from_a_server_it_could_not_reach(tmp_path: Path):
    """After a first connect, whether it had to wait for the server or not (a process just
    started cannot tell that the server was away a moment ago), and after each reconnect:
    a lease that passed meanwhile still counts for a while (no agent could renew one)."""
    async with RestartableServer(tmp_path / "up") as server, Broker(server.url) as broker:
        first = broker.link.back_at
        assert first > 0
        await server.stop()
        await server.start()
        await eventually(lambda: broker.link.back_at > first, 15)
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    with capture_logs() as logs:
        waiting = asyncio.create_task(Broker(url, wait=True).__aenter__())
        await eventually(lambda: any(line["event"] == "waiting for NATS" for line in logs))
    async with EmbeddedServer(port=port, store_dir=tmp_path / "late"):
        broker = await asyncio.wait_for(waiting, 30)
        try:
            assert broker.link.back_at > 0
        finally:
            await broker.close()


async def test_an_error_that_broke_the_connection_names_the_server_it_came_from(tmp_path: Path):
    """A reset comes once the connection is gone: its line said `server=` (empty) and the
    whole seed list (a cluster trial). It names the server last connected to."""
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server:
        broker = await Broker(server.url).__aenter__()
        try:
            there = broker.link.server
            await server.kill()
            await eventually(lambda: not broker.connected)
            broker.link._down_since = None  # nats-py calls error_cb before disconnected_cb
            with capture_logs() as logs:
                await broker.link._on_error(ConnectionResetError(104, "Connection reset by peer"))
        finally:
            await broker.close()
    [said] = errors_in(logs)
    assert there and said["server"] == there, said
