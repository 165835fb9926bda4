"""The shipped nats-server configuration is one the server accepts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentreach.broker import find_server_binary

CONFIG = Path(__file__).parents[2] / "deploy" / "nats" / "nats-server.conf"


async def test_single_node_config_is_valid():
    """`nats-server -c deploy/nats/nats-server.conf -t` passes."""
    process = await asyncio.create_subprocess_exec(
        str(find_server_binary()),
        "-c",
        str(CONFIG),
        "-t",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, out.decode()
    assert b"is valid" in out
