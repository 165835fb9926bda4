"""A state that waits for an event waits no longer than its wait_s: through a real server,
its timer comes back from REACH_WORKFLOWS and moves the machine to its on_timeout state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import read_stream
from agentreach.cli.workflow_views import clock, tree
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows.control import signal
from agentreach.envelopes import now_ms
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, serving
from tests.e2e.test_workflows import _until_record, workflows
from tests.support import eventually, held, until_true

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
    assert f"waits here for a signal until {clock(submitted.deadline_ms)}" in tree(waits)


@contextlib.asynccontextmanager
async def stopped_while_waiting(
    broker, start_coordinator, watcher, flows
) -> AsyncIterator[tuple[asyncio.Task, str, int]]:  # type: ignore[no-untyped-def]
    """An `approval` instance in `submitted`, waiting for a signal, and then no coordinator:
    ``(the starter's invoke, the instance id, when the wait ends)``, the agent still serving."""
    agent = reviewers()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        async with start_coordinator(fast(workflows=flows)) as coordinator:
            await eventually(lambda: agent.agent_id in coordinator.directory.cards)
            waiting = asyncio.create_task(client.invoke("approval", {}, ttl_ms=30_000))
            instance = (await watcher.event("workflow_started")).message_id
            waits = await _until_record(
                broker, instance, lambda r: r.steps["submitted"].deadline_ms > 0
            )
        yield waiting, instance, waits.steps["submitted"].deadline_ms


async def test_a_signal_sent_in_time_while_no_coordinator_ran_is_taken(
    broker, start_coordinator, watcher
):
    """`approve` is sent within the state's wait while no coordinator runs; the coordinator
    comes back after the wait's end. The signal, stored in time, goes first: the timer
    (armed before it, delivered again with it) used to win, and `escalated` ran."""
    flows = workflows(approval=APPROVAL)
    async with stopped_while_waiting(broker, start_coordinator, watcher, flows) as (
        waiting,
        instance,
        due_ms,
    ):
        await signal(broker, instance, "approve")
        # What is under test is the clock passing the wait's end while nobody runs it.
        await asyncio.sleep((due_ms - now_ms() + 500) / 1000)
        async with start_coordinator(fast(workflows=flows)):
            outcome = await waiting
    assert outcome == {"ok": True}
    assert not [e for e in watcher.events if e.event == "step_timed_out"]


async def test_a_step_s_result_stored_before_its_timeout_while_no_coordinator_ran_counts(
    broker, start_coordinator, watcher
):
    """Step `a` (timeout 2 s) finishes within its timeout while no coordinator runs; the
    coordinator comes back after the timeout. The result, stored in time, goes first: the
    timer looked for replies on the bare reply subject, where none is (each names its
    sender), and timed the step out."""
    agent, gate, runs = held("chore-in-time", "chore")
    flows = {"timed": wf.chain(wf.step("a", "chore", timeout_s=2))}
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        async with start_coordinator(fast(workflows=flows)) as coordinator:
            await eventually(lambda: "chore-in-time" in coordinator.directory.cards)
            waiting = asyncio.create_task(client.invoke("timed", {"n": 1}, ttl_ms=30_000))
            step = await watcher.event("accepted", topic="chore")
            record = await _until_record(broker, step.trace_id, lambda r: "a" in r.steps)
            due_ms = record.steps["a"].deadline_ms
        gate.set()
        await watcher.event("completed", message_id=step.message_id)
        # What is under test is the clock passing the step's timeout while nobody runs it.
        await asyncio.sleep(max(0, due_ms - now_ms() + 500) / 1000)
        async with start_coordinator(fast(workflows=flows)):
            outcome = await waiting
    assert outcome == {"n": 1} and len(runs) == 1
    assert not [e for e in watcher.events if e.event == "step_timed_out"]


REMIND = """
states:
  initial: submitted
  states:
    submitted:
      intent: check
      wait_s: 1
      on_timeout: reminded
      next: [{event: approve, to: approved}]
    reminded:
      next: [{event: approve_late, to: approved}]
    approved: {terminal: true, input: {ok: true}}
"""


async def test_signal_says_not_taken_when_the_wait_ended_first(broker, start_coordinator, watcher):
    """`approve` sent after the wait's end while no coordinator ran: the coordinator, back,
    times the wait out first (`reminded`), then ignores `approve`. The record changed
    meanwhile, and `reach workflows signal` said "approve taken"; it says what the
    coordinator did: not taken, exit 1."""
    flows = workflows(approval=REMIND)
    async with stopped_while_waiting(broker, start_coordinator, watcher, flows) as (
        waiting,
        instance,
        due_ms,
    ):
        await asyncio.sleep((due_ms - now_ms() + 300) / 1000)
        said = asyncio.create_task(
            run(*reach_argv(broker, "workflows", "signal", instance, "approve"))
        )
        stored = broker.names.workflow_signal(instance, "approve")
        await until_true(lambda: read_stream(broker, broker.names.workflows_stream, stored))
        async with start_coordinator(fast(workflows=flows)):
            answered = await said
            await signal(broker, instance, "approve_late")
            assert await waiting == {"ok": True}
    assert answered.returncode == 1, answered.stdout
    assert "no state waits for approve" in answered.stdout and "not taken" in answered.stdout
