"""Calls (core request/reply on ``reach.call.<topic>``) answered with the task's result."""

from __future__ import annotations

import asyncio

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.envelopes import headers as h


def sleeper() -> Agent:
    agent = Agent("call-sleeper", startup_delay=0)

    @agent.handler("nap")
    async def nap(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(payload["s"])  # the work outlasts the call's ttl
        return {"slept": payload["s"]}

    return agent


async def test_a_call_whose_task_runs_past_its_ttl_gets_the_result(broker, coordinator):
    """The ttl bounds how long a task may wait to start; once an agent accepted it, the call
    waits for its execute budget, and answers with the result, not `no_result`."""
    async with sleeper().running(broker=broker):
        answer = await broker.nc.request(
            broker.names.call("nap"), b'{"s": 1.5}', timeout=10, headers={h.TTL: "300"}
        )
    assert answer.headers is not None and answer.headers.get(h.KIND) == "result"
    assert envelopes.decode_json(answer.data) == {"slept": 1.5}
