"""An agent run as its own process by the crash tests (`reach agent tests.e2e.victim:agent`).

Each run of the handler appends "start <ctx.resumed>" to $VICTIM_LOG; the first run then
hangs (to be killed), later runs append "done" — the side effect that must happen once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentreach.agents import Agent, TaskContext

agent = Agent("victim", startup_delay=0, ack_wait=1.0)


@agent.handler("slow_write", deadline_ms=20_000)
def slow_write(ctx: TaskContext, payload: dict) -> dict:
    log = Path(os.environ["VICTIM_LOG"])
    with log.open("a") as f:
        f.write(f"start {ctx.resumed}\n")
    if log.read_text().count("start") == 1:
        ctx.progress_sync("started")  # the test kills the process once it sees this
        time.sleep(60)  # killed here
    with log.open("a") as f:
        f.write("done\n")
    return {"written": True}
