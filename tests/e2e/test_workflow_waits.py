"""A state that waits for an event waits no longer than its wait_s: through a real server,
its timer comes back from REACH_WORKFLOWS and moves the machine to its on_timeout state."""

from __future__ import annotations

import asyncio

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.cli.workflows import _clock, tree
from tests.e2e.routing_support import fast, serving
from tests.e2e.test_workflows import _until_record, workflows

APPROVAL = """
states:
  initial: submitted
  states:
    submitted:
      intent: check
      wait_s: 1
      on_timeout: escalated
      next:
        - {event: approve, to: approved}
    approved: {terminal: true, input: {ok: true}}
    escalated: {intent: ask_manager, terminal: true}
"""


def reviewers() -> Agent:
    agent = Agent("reviewers", startup_delay=0)

    @agent.handler("check")
    async def check(ctx: TaskContext, payload: object) -> str:
        return "looks fine"

    @agent.handler("ask_manager")
    async def ask_manager(ctx: TaskContext, payload: object) -> dict:
        return {"asked": payload}

    return agent


async def test_a_state_no_event_came_for_goes_to_its_on_timeout_state(
    broker, start_coordinator, watcher
):
    """Nobody approves: a second after `check` completed, `escalated` runs with
    `{"timed_out": "submitted"}`, the trace says what was waited for, and `reach workflows
    show` said until when while it waited."""
    async with (
        start_coordinator(fast(workflows=workflows(approval=APPROVAL))) as coordinator,
        serving(broker, coordinator, reviewers()),
        ReachClient(broker=broker) as client,
    ):
        waiting = asyncio.create_task(client.invoke("approval", {}))
        instance = (await watcher.event("workflow_started")).message_id
        waits = await _until_record(
            broker, instance, lambda r: r.steps["submitted"].status == "completed"
        )
        outcome = await waiting
        timed_out = await watcher.event("step_timed_out")
    assert outcome == {"asked": {"timed_out": "submitted"}}
    assert timed_out.detail["waited_for"] == ["approve"]
    submitted = waits.steps["submitted"]
    assert waits.current == "submitted" and submitted.deadline_ms == submitted.ended_ms + 1000
    assert f"waits here for a signal until {_clock(submitted.deadline_ms)}" in tree(waits)
