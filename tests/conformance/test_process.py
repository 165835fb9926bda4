"""The agent under test as a process: a crash or a stop reaches every process of its command."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agentreach.conformance.process import AgentProcess


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie until init reaps it: gone too.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


async def test_a_crash_kills_the_child_a_wrapper_started(tmp_path):
    """The kit signalled the command's own pid: a wrapper (`sh -c`, `npm start`) died and
    the agent it ran served on, and a forked child outlived the kit (security re-test)."""
    child = tmp_path / "child.pid"
    agent = AgentProcess(["sh", "-c", f"sleep 300 & echo $! > {child}; wait"], tmp_path)
    await agent.start()
    async with asyncio.timeout(10):
        while not child.exists() or not child.read_text().strip():  # noqa: ASYNC110 - a file appears
            await asyncio.sleep(0.01)
    pid = int(child.read_text())
    await agent.kill()
    async with asyncio.timeout(10):
        while not _gone(pid):  # noqa: ASYNC110 - a process's end has no event here
            await asyncio.sleep(0.01)
