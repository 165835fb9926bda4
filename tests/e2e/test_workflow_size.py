"""A workflow whose record outgrows one message of the server (it keeps every step's input and
output inline): it hung, its writes retried each second until its ttl, and then ended as
`expired`, the real cause nowhere (a walkthrough). Now it fails at once, saying why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentreach.agents import Agent, ReachClient, Rejected, SignalOutcome, TaskContext, TaskFailed
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from agentreach.envelopes import WorkflowRecord, new_id
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, serving
from tests.e2e.test_workflows import _until_record, workflows

BLOB = 200_000  # under the claim-check threshold: kept inline, in the record too


def bulky() -> Agent:
    agent = Agent("bulky", startup_delay=0)

    @agent.handler("bulk", capacity=8)
    async def bulk(ctx: TaskContext, payload: Any) -> dict[str, str]:
        return {"blob": "x" * BLOB}

    return agent


async def test_a_chain_whose_record_outgrows_a_message_fails_saying_so(
    broker, start_coordinator, watcher
):
    flows = {"bulky-chain": wf.chain(*(wf.step(f"s{n}", "bulk") for n in range(8)))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, bulky()),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("bulky-chain", {}, message_id="bulky-1", ttl_ms=120_000)
        letter = await watcher.dead_letter("workflow_failed", message_id="bulky-1")
        record = await read_record(broker, "bulky-1")
    error = failed.value.error
    assert (error.type, error.retryable) == ("record_too_large", False)
    assert "outgrew what the server stores in one message" in error.message
    assert letter.error is not None and letter.error.type == "record_too_large"
    assert record is not None and record.status == "failed"
    done = [k for k, run in record.steps.items() if run.status == "completed"]
    assert 2 <= len(done) < 8  # it ran until its record would not fit


async def test_a_workflow_too_large_to_start_is_refused_at_once(broker, start_coordinator):
    """Each of 300 branches keeps its own copy of a 4 KB input: the record cannot be
    created. The starter heard nothing (NotAcknowledged), then `expired` at the ttl."""
    branches = [wf.step(f"b{n}", "bulk") for n in range(300)]
    flows = {"wide": wf.fanout(branches)}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, bulky()),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(Rejected) as refused:
            await client.invoke("wide", {"pad": "y" * 4_000}, ttl_ms=120_000)
    assert refused.value.error.type == "record_too_large"
    assert refused.value.ending == "rejected"


def bulky_with_undo(ran: list[str], undone: list[str]) -> Agent:
    agent = bulky()

    @agent.handler("unbulk", capacity=8)
    async def unbulk(ctx: TaskContext, payload: Any) -> None:
        undone.append(payload["step"])

    return agent


async def test_the_step_whose_result_outgrows_the_record_is_undone_too(
    broker, start_coordinator, watcher
):
    """The step whose result would not fit ran: it counts as completed (its output not
    kept) and is undone with the others. It was marked cancelled, its outcome awaited (it had
    come, and been dropped) for a minute, and then left as it was: its effect stood."""
    steps = [wf.step(f"s{n}", "bulk", compensate="unbulk") for n in range(8)]
    flows = {"bulky-saga": wf.chain(*steps, on_failure="compensate")}
    undone: list[str] = []
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, bulky_with_undo([], undone)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("bulky-saga", {}, message_id="saga-1", ttl_ms=120_000)
        record = await read_record(broker, "saga-1")
    assert record is not None
    ran = [k for k, run in record.steps.items() if run.message_id]
    done = [k for k, run in record.steps.items() if run.status == "completed"]
    assert done == ran  # none cancelled: each step sent ran, the last one too
    assert sorted(undone) == sorted(ran)
    last = ran[-1]
    assert record.steps[last].output is None
    assert failed.value.error.message.startswith(f"step {last!r}'s result: the instance's")


GROWING = """
states:
  initial: a
  states:
    a: {intent: bulk, next: [{event: go, to: b}]}
    b: {intent: bulk, next: [{event: go, to: c}]}
    c: {intent: bulk, next: [{event: go, to: done}]}
    done: {terminal: true}
"""


def bulkier() -> Agent:
    """Steps whose 250 KB outputs (under the claim-check threshold: a secured deployment has
    none), each copied into the next state's input, fill the record (1 MB at most) in two
    and a half states, with the 100 KB start input and its copy in the first state."""
    agent = Agent("bulkier", startup_delay=0)

    @agent.handler("bulk")
    async def bulk(ctx: TaskContext, payload: Any) -> dict[str, str]:
        return {"blob": "x" * 250_000}

    return agent


@pytest.mark.parametrize("sender", ["sdk", "cli"])
async def test_a_signal_that_outgrows_the_record_is_answered_with_the_failure(
    broker, start_coordinator, sender
):
    """The signal whose change would not fit failed the instance, and nothing answered it:
    its sender waited out its wait and heard DeadlineExceeded (the CLI: "no answer yet"), as
    if the signal might still be taken."""
    flows = workflows(growing=GROWING)
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, bulkier()),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        instance = new_id()
        invoked = asyncio.create_task(
            alice.invoke("growing", {"pad": "y" * 100_000}, message_id=instance)
        )
        await _until_record(broker, instance, lambda r: _done_in(r, "a"))
        assert (await alice.signal_workflow(instance, "go", wait_s=10)).taken
        await _until_record(broker, instance, lambda r: _done_in(r, "b"))
        if sender == "sdk":
            outcome = await alice.signal_workflow(instance, "go", wait_s=10)
            assert outcome == SignalOutcome(instance, "go", taken=False, ended="failed")
        else:
            argv = reach_argv(broker, "workflows", "signal", instance, "go", "--wait", "10")
            signalled = await run(*argv)
            assert signalled.returncode == 1, signalled.stdout
            said = f"{instance}: go not taken: the instance failed: the instance's record outgrew"
            assert signalled.stdout.startswith(said), signalled.stdout
        with pytest.raises(TaskFailed) as failed:
            await asyncio.wait_for(invoked, 10)
    assert failed.value.error.type == "record_too_large"


def _done_in(record: WorkflowRecord, state: str) -> bool:
    return record.current == state and record.steps[state].status == "completed"
