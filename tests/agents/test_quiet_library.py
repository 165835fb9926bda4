"""The SDK used from a plain script, with no logging set up, prints no debug or info lines."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentreach.broker import Broker, EmbeddedServer, Topology, provision

SCRIPT = """
import asyncio, sys
from agentreach import CompensationWorker, ReachClient

async def handle(letter, comp):
    pass

async def main(url):
    worker = CompensationWorker("plain", handle)
    async with worker.running(url), ReachClient(url) as client:
        print("READY", flush=True)
        await asyncio.sleep(0.5)
        while not client.broker.connected:  # through the server's restart
            await asyncio.sleep(0.1)
        sys.stdin.readline()  # the test says when it has seen the restart through
        await client.publish("nobody_serves_this", {"n": 1})

asyncio.run(main(sys.argv[1]))
"""


async def test_a_plain_script_prints_no_debug_lines_through_a_server_restart(tmp_path: Path):
    """ReachClient and CompensationWorker in a script that configured no logging, across a
    server restart: warnings (the outage, no coordinator) are shown, debug and info lines
    are not (sixteen `[debug] nats error … Connect call failed` lines were, as structlog
    unconfigured prints every level)."""
    store = tmp_path / "nats"
    async with EmbeddedServer(port=-1, store_dir=store) as server:
        url, port = server.url, server.port
        async with Broker(url) as broker:
            await provision(broker, Topology.default(broker.names))
        script = tmp_path / "plain.py"
        script.write_text(SCRIPT)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert process.stdout is not None and process.stdin is not None
        said = [await asyncio.wait_for(process.stdout.readline(), 30)]
        assert said[-1].startswith(b"READY"), said
    await asyncio.sleep(2.0)  # the client retries meanwhile: each failure was a debug line
    async with EmbeddedServer(port=port, store_dir=store):
        out, _ = await asyncio.wait_for(process.communicate(b"go\n"), 60)
    lines = b"".join(said).decode() + out.decode()
    assert process.returncode == 0, lines
    assert "nats disconnected; reconnecting" in lines  # a warning: shown
    assert "[debug" not in lines and "[info" not in lines, lines
