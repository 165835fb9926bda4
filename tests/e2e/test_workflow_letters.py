"""A workflow's step failures in the dead-letter stream, and what its caller hears: a step's
letter names its workflow and whether the workflow handles the failure, a compensation
worker acts on each failure once, and a workflow whose steps ran is never `Rejected`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from agentreach.agents import (
    Agent,
    Compensation,
    CompensationWorker,
    DeadlineExceeded,
    ReachClient,
    Rejected,
    TaskContext,
    TaskFailed,
)
from agentreach.broker import Broker, consumer_state
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import DeadLetter, Event
from tests.e2e.routing_support import fast, serving
from tests.support import Watcher, until_true

PARTIAL = """
fanout:
  branches:
    - {name: web, intent: search_web}
    - {name: research, intent: research, timeout_s: 1, on_timeout: partial}
  join: {policy: all}
  then: {name: merge, intent: merge}
"""
PLAN_THEN_HOLD = "chain: [{name: plan, intent: plan}, {name: brief, intent: hold}]"


def workflows(**yaml: str) -> dict[str, WorkflowSpec]:
    return {name: msgspec.yaml.decode(t.encode(), type=WorkflowSpec) for name, t in yaml.items()}


def team(gate: asyncio.Event) -> Agent:
    """`research` and `hold` wait for ``gate`` (past any deadline); the rest answer at once."""
    agent = Agent("team", startup_delay=0)

    async def stuck(ctx: TaskContext, payload: Any) -> str:
        await gate.wait()
        return "too late"

    async def search_web(ctx: TaskContext, payload: Any) -> list[str]:
        return ["web"]

    async def merge(ctx: TaskContext, payload: Any) -> Any:
        return payload

    async def plan(ctx: TaskContext, payload: Any) -> dict[str, str]:
        return {"outline": "intro"}

    for intent, handler in {
        "research": stuck,
        "hold": stuck,
        "search_web": search_web,
        "merge": merge,
        "plan": plan,
    }.items():
        agent.handler(intent)(handler)
    return agent


def recording(calls: list[DeadLetter]) -> Callable[[DeadLetter, Compensation], Awaitable[None]]:
    async def handle(letter: DeadLetter, comp: Compensation) -> None:
        calls.append(letter)

    return handle


async def settled(broker: Broker, *workers: CompensationWorker) -> None:
    """Until each worker has taken every letter there is (acknowledged, handled or not)."""

    async def done() -> bool:
        for worker in workers:
            durable = f"compensation-{worker.name}"
            state = await consumer_state(broker, broker.names.dlq_stream, durable)
            if state is None or state.num_pending or state.num_ack_pending:
                return False
        return True

    await until_true(done, timeout=20.0)


async def step_end(watcher: Watcher, message_id: str) -> DeadLetter | Event:
    """The step's dead letter, or the `rejected` event of its retry refused for its ended
    instance."""

    def found() -> DeadLetter | Event | None:
        letter = next((x for x in watcher.dead_letters if x.message_id == message_id), None)
        refused = (e for e in watcher.events if e.message_id == message_id)
        return letter or next((e for e in refused if e.event == "rejected"), None)

    return await watcher.until(found, f"the end of {message_id}")


async def step_letter(watcher: Watcher, message_id: str) -> DeadLetter:
    def found() -> DeadLetter | None:
        return next((x for x in watcher.dead_letters if x.message_id == message_id), None)

    return await watcher.until(found, f"dead letter of {message_id}")


async def test_a_branch_the_join_does_without_is_left_to_its_workflow(
    broker, start_coordinator, watcher
):
    """A branch with `on_timeout: partial` runs past its 1 s: the workflow completes with it
    missing, and the branch's task still ends in REACH_DLQ (nothing vanishes), its letter
    naming the instance and step and saying the workflow handled it. A worker for `expired`
    is not handed it; one with include_handled is."""
    gate, plain, every = asyncio.Event(), list[DeadLetter](), list[DeadLetter]()
    skipping = CompensationWorker("wf-skip", recording(plain), reasons=["expired"])
    including = CompensationWorker("wf-all", recording(every), include_handled=True)
    async with (
        start_coordinator(fast(workflows=workflows(study=PARTIAL))) as coordinator,
        serving(broker, coordinator, team(gate)),
        skipping.running(broker=broker),
        including.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        merged = await client.invoke("study", {"q": "nats"}, message_id="study-1")
        letter = await step_letter(watcher, message_id_of("study-1", "research", 1))
        await settled(broker, skipping, including)
        gate.set()
    assert merged["missing"] == {"research": "step 'research' did not finish within 1 s"}
    assert letter.workflow is not None
    assert (letter.workflow.instance_id, letter.workflow.step) == ("study-1", "research")
    assert letter.workflow.handled and not letter.workflow.compensation
    assert plain == []
    assert [x.message_id for x in every] == [letter.message_id]
    assert not [x for x in watcher.dead_letters if x.topic == "study"]  # it completed


async def test_an_expired_workflow_is_compensated_once_and_its_caller_hears_it_ran(
    broker, start_coordinator, watcher
):
    """`plan` completes, `brief` holds past the starting task's 2 s ttl: the instance is
    dead-lettered, and so is the held step, unless its run's deadline (the ttl left) made
    it fail first and its retry found the instance ended (then it is refused, its
    instance's letter standing for it: a loaded run); a worker for `expired` acts once, on
    the instance's letter. Its caller hears TaskFailed (a step ran), on the first call and
    when it asks again with the same id, never Rejected (nothing ran)."""
    gate, calls = asyncio.Event(), list[DeadLetter]()
    worker = CompensationWorker("wf-expired", recording(calls), reasons=["expired"])
    async with (
        start_coordinator(fast(workflows=workflows(brief=PLAN_THEN_HOLD))) as coordinator,
        serving(broker, coordinator, team(gate)),
        worker.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as first:
            await client.invoke("brief", {}, message_id="brief-1", ttl_ms=2000)
        step = await step_end(watcher, message_id_of("brief-1", "brief", 1))
        own = await watcher.dead_letter("expired", message_id="brief-1")
        with pytest.raises(TaskFailed) as again:
            await client.invoke("brief", {}, message_id="brief-1", ttl_ms=2000)
        await settled(broker, worker)
        gate.set()
    for raised in (first.value, again.value):
        assert not isinstance(raised, Rejected)
        assert raised.error.type == "expired"
    assert own.workflow is None
    if isinstance(step, DeadLetter):
        assert step.workflow is not None and step.workflow.handled
    else:
        assert "not dispatched" in str(step.detail)  # its instance had ended
    assert [x.message_id for x in calls] == ["brief-1"]
    ended = next(
        e for e in watcher.events if e.event == "dead_lettered" and e.message_id == own.message_id
    )
    assert ended.detail["ran"] is True


async def test_invoke_waits_as_long_as_the_workflow_lives(broker, start_coordinator):
    """A workflow acknowledges at once and lives for its ttl (ack + execute deadlines):
    invoke, which waited the execute deadline from that ack, gave up a moment before the
    workflow ended (`DeadlineExceeded` at 31 s, `expired` at 32 s with the defaults). It now
    waits at least until the ttl has run out, and hears how the workflow ended."""
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=workflows(brief=PLAN_THEN_HOLD))) as coordinator,
        serving(broker, coordinator, team(gate)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as heard:
            await client.invoke("brief", {}, message_id="brief-ttl", execute_deadline_ms=1_000)
        gate.set()
    assert heard.value.error.type == "expired"  # its 3 s ttl, past the 1 s execute deadline
    assert not isinstance(heard.value, DeadlineExceeded)
