"""The agent `reach conformance` drives: the conformance topic's handler, as docs/protocol.md
(§18) specifies it, written with the Python SDK.

REACH_AGENT_ID=conformance-py reach agent agentreach.examples.conformance:agent
reach conformance conformance-py

Settings come from the environment, so the kit can start (and restart) it as a command:
``REACH_AGENT_ID`` (default ``conformance-py``), ``REACH_CONFORMANCE_TOPIC`` (default
``conformance``) and ``REACH_ACK_WAIT_S`` (default 5: a crashed run comes back that soon).
"""

import asyncio
import os

from agentreach.agents import Agent, PermanentError, TaskContext

TOPIC = os.environ.get("REACH_CONFORMANCE_TOPIC", "conformance")

agent = Agent(
    os.environ.get("REACH_AGENT_ID", "conformance-py"),
    tags={"role": "conformance", "lang": "python"},
    startup_delay=0,
    ack_wait=float(os.environ.get("REACH_ACK_WAIT_S", "5")),
)


class Retryable(Exception):
    """A failure worth another attempt."""


@agent.handler(TOPIC, version="1.0.0", capacity=8)
async def conformance(ctx: TaskContext, payload: dict) -> object:
    op = payload.get("op") if isinstance(payload, dict) else None
    if op == "echo":
        return {"value": payload.get("value"), "attempt": ctx.attempt}
    if op == "progress":
        for note in payload.get("notes", []):
            await ctx.progress(note)
        return {"notes": len(payload.get("notes", []))}
    if op == "fail":
        until = payload.get("until_attempt")
        if until is None or ctx.attempt < until:
            raise Retryable(payload.get("message", "failing on purpose"))
        return {"attempt": ctx.attempt}
    if op == "reject":
        raise PermanentError(payload.get("message", "refused on purpose"))
    if op == "sleep":
        await ctx.progress("started")  # one per run: the kit counts runs by these
        await asyncio.sleep(payload.get("ms", 0) / 1000)
        return {"slept_ms": payload.get("ms", 0)}
    raise PermanentError(f"unknown op {op!r}")
