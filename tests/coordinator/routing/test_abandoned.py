"""A workflow step's visit sent again (after a retry's backoff, from an agent that died, or
after a wait in intake) runs only until its step's deadline, on a real server: with a fresh
execute budget it could complete after its instance stopped waiting and undid the steps
before it."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows.actions import message_id_of
from tests.e2e.routing_support import fast, serving

FLOWS = {
    "order": wf.chain(
        wf.step("charge", "charge", compensate="refund"),
        wf.step("ship", "ship", timeout_s=4.0),
        on_failure="compensate",
    )
}


def warehouse(runs: Counter[str], budgets: list[int], cut_short: asyncio.Event) -> Agent:
    """Charges and refunds at once; the first shipment fails after 1 s (a retryable error),
    the second would take 8 s."""
    agent = Agent("warehouse", startup_delay=0)

    @agent.handler("charge")
    async def charge(ctx: TaskContext, payload: Any) -> Any:
        runs["charge"] += 1
        return {"charged": True}

    @agent.handler("refund")
    async def refund(ctx: TaskContext, payload: Any) -> Any:
        runs["refund"] += 1
        return {"refunded": True}

    @agent.handler("ship")
    async def ship(ctx: TaskContext, payload: Any) -> Any:
        runs["ship"] += 1
        budgets.append(ctx.deadline_ms)
        if runs["ship"] == 1:
            await asyncio.sleep(1.0)
            raise RuntimeError("the courier did not answer")
        try:
            await asyncio.sleep(8.0)
        except asyncio.CancelledError:
            cut_short.set()
            raise
        runs["shipped"] += 1
        return {"shipped": True}

    return agent


async def test_a_step_retried_late_gets_only_what_is_left_of_its_timeout(
    broker, start_coordinator, watcher
) -> None:
    """`ship` (timeout 4 s) fails after 1 s and is retried: the retry's execute budget is
    what is left of the 4 s, not 4 s again, so its handler is stopped about when the step
    times out, and nothing ships after the charge was refunded. (With 1.5 s, a loaded
    machine's retry came after the timeout, and never ran.)"""
    runs: Counter[str] = Counter()
    budgets: list[int] = []
    cut_short = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, warehouse(runs, budgets, cut_short)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("order", {"sku": "a"}, message_id="o1")
        await asyncio.wait_for(cut_short.wait(), 10)
        second = [
            e
            for e in watcher.events
            if e.event == "routed" and e.message_id == message_id_of("o1", "ship", 1)
        ]
    assert failed.value.error.type == "timeout"
    assert runs["charge"] == runs["refund"] == 1 and runs["ship"] == 2
    assert runs["shipped"] == 0
    assert 3900 < budgets[0] <= 4000 and 0 < budgets[1] <= 3100, budgets
    assert [e.detail["execute_ms"] for e in second][1] <= 3100
