"""An agent run as its own process by the liveness tests (`reach agent tests.e2e.pulse:agent`).

Heartbeats every $PULSE_INTERVAL seconds. ``block`` holds the event loop (the
mistake the watchdog exists for); ``burn`` is CPU-bound work in a worker thread.
"""

from __future__ import annotations

import os
import time

from agentreach.agents import Agent, TaskContext

agent = Agent(
    os.environ.get("PULSE_ID", "pulse"),
    startup_delay=0,
    heartbeat_interval=float(os.environ.get("PULSE_INTERVAL", "0.2")),
)


@agent.handler("block", deadline_ms=60_000)
async def block(ctx: TaskContext, payload: dict) -> dict:
    time.sleep(payload["seconds"])  # noqa: ASYNC251 - blocking the loop is the point
    return {"blocked": payload["seconds"]}


@agent.handler("burn", deadline_ms=60_000)
def burn(ctx: TaskContext, payload: dict) -> dict:
    until, n = time.monotonic() + payload["seconds"], 0
    while time.monotonic() < until:
        n += sum(i * i for i in range(1000))
    return {"burned": payload["seconds"]}
