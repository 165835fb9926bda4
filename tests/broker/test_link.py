"""What a connection's callbacks say: the same asynchronous error again and again is one line
a minute, with how often it came meanwhile."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

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
