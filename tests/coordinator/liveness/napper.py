"""An agent run as its own process by the presence-check tests
(`reach agent tests.coordinator.liveness.napper:agent`), so that it can be killed with -9.

``nap`` sleeps without blocking its loop: the agent keeps answering its presence checks and
heartbeating every $NAPPER_INTERVAL seconds, with a task in flight.
"""

from __future__ import annotations

import asyncio
import os

from agentreach.agents import Agent, TaskContext

agent = Agent(
    os.environ.get("NAPPER_ID", "napper"),
    startup_delay=0,
    heartbeat_interval=float(os.environ.get("NAPPER_INTERVAL", "2.0")),
)


@agent.handler("nap", deadline_ms=120_000)
async def nap(ctx: TaskContext, payload: dict) -> dict:
    await asyncio.sleep(payload["seconds"])
    return {"napped": payload["seconds"], "by": agent.agent_id}
