"""`reach workflows list` and `show` as tables and trees (pure: records made here), and as
JSON for scripts (through a real server)."""

from __future__ import annotations

import asyncio
import json

import msgspec

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.cli.workflow_views import table, tree
from agentreach.coordinator import workflow as wf
from agentreach.envelopes import ErrorInfo, StepRun, Task, WorkflowRecord
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, serving


def record(**fields) -> WorkflowRecord:  # type: ignore[no-untyped-def]
    task = Task(v=1, message_id="wf-1", trace_id="wf-1", topic="order")
    return WorkflowRecord(
        instance_id="wf-1", workflow="order", trace_id="wf-1", task=task, **fields
    )


def test_a_running_machine_has_no_total_of_steps_to_be_done():
    """It said DONE 2/2 of the two states it had entered, as if it were finished."""
    entered = {"pending": StepRun(status="completed"), "paid": StepRun(status="completed")}
    running = record(status="running", steps=entered, current="paid")
    ended = record(status="completed", steps=entered)
    assert " 2/-   paid" in table([running]).splitlines()[1]
    assert " 2/2 " in table([ended]).splitlines()[1]


def test_a_wide_fan_out_names_a_few_running_branches_and_counts_the_rest():
    """300 running branches made a line of over 2,000 characters (a walkthrough)."""
    branches = {f"b{n}": StepRun(status="running") for n in range(300)}
    line = table([record(status="running", steps=branches, steps_total=300)]).splitlines()[1]
    assert line.endswith(" 0/300  b0, b1, b2 +297")


def test_a_step_stopped_without_an_error_says_why():
    """`workflows show` marked a step `cancelled`, no reason given: its instance expired."""
    steps = {"s1": StepRun(status="completed"), "s2": StepRun(status="cancelled", intent="b")}
    expired = ErrorInfo(type="expired", message="the ttl passed", retryable=False)
    shown = tree(record(status="failed", steps=steps, error=expired, started_ms=1))
    line = next(ln for ln in shown.splitlines() if "s2" in ln)
    assert line.endswith("← stopped as the instance ended: expired")


def test_a_step_s_error_is_one_line_of_the_tree():
    """A step agent's error with a line break drew a line of its own under the tree."""
    forged = ErrorInfo(type="boom", message="x\n  └─ s9  completed", retryable=False)
    steps = {"s1": StepRun(status="failed", error=forged, started_ms=1, ended_ms=2)}
    shown = tree(record(status="failed", steps=steps, error=forged, started_ms=1))
    assert len(shown.splitlines()) == 3, shown
    assert "x\\u000a  └─ s9" in shown


def test_a_wait_cut_short_and_a_step_never_started_are_not_pass_throughs():
    """A state waiting for an event when its instance was cancelled, and a step whose input
    named nothing, both read `(pass-through)` (a walkthrough)."""
    missing = ErrorInfo(type="input_missing", message="'$.input.x' names nothing", retryable=False)
    steps = {
        "pick": StepRun(status="cancelled", started_ms=1, ended_ms=5),
        "plan": StepRun(status="failed", error=missing, started_ms=1, ended_ms=1),
    }
    cancelled = ErrorInfo(type="cancelled", message="by an operator", retryable=False)
    shown = tree(record(status="cancelled", steps=steps, error=cancelled, started_ms=1))
    lines = {key: next(ln for ln in shown.splitlines() if f" {key} " in ln) for key in steps}
    assert "(waited for an event)" in lines["pick"]
    assert "(not started)" in lines["plan"]
    assert "(pass-through)" not in shown


def test_the_state_a_machine_was_cancelled_in_did_not_complete():
    """A state waiting for an event (entered, so recorded completed) when its instance was
    cancelled read `completed … (pass-through)`, then `0 ms` for its wait (a fresh reader);
    a state's run a signal moved the machine on from read as a branch its join went
    without."""
    steps = {
        "placed": StepRun(status="completed", started_ms=1, ended_ms=1),
        "awaiting_ship": StepRun(status="completed", started_ms=2, ended_ms=2),
    }
    cancelled = ErrorInfo(type="cancelled", message="by an operator", retryable=False)
    waiting = record(
        status="cancelled", steps=steps, error=cancelled, started_ms=1, current="awaiting_ship",
        path=["placed", "awaiting_ship"], ended_ms=1_027,
    )  # fmt: skip
    line = next(ln for ln in tree(waiting).splitlines() if " awaiting_ship " in ln)
    assert " cancelled " in line and " 1025 ms  (waited for an event)" in line, line
    assert line.endswith("← stopped as the instance ended: cancelled")
    moved = {"charge": StepRun(status="cancelled", intent="charge", started_ms=1)}
    done = record(status="completed", steps=moved, started_ms=1, path=["charge", "refunded"])
    line = next(ln for ln in tree(done).splitlines() if "─ charge " in ln)
    assert line.endswith("← stopped: a signal moved the machine on without it"), line


def test_a_step_stopped_while_it_ran_says_its_outcome_is_awaited():
    """It read `cancelled` while it still ran, then flipped to `completed`."""
    steps = {"reserve": StepRun(status="cancelled", intent="reserve", started_ms=1)}
    shown = tree(record(status="compensating", steps=steps, awaiting=["reserve"], started_ms=1))
    line = next(
        ln for ln in shown.splitlines() if ln.lstrip().startswith(("├─ reserve", "└─ reserve"))
    )
    assert "its outcome is awaited, then undone" in line


async def test_list_and_show_print_the_stored_records_as_json(broker, start_coordinator):
    """`--json`: one record per line for list, the record for show, each what the bucket
    stores (so a script reads it with the published schema); refused for cancel."""
    agent = Agent("echo", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        return payload

    flows = {"twice": wf.chain(wf.step("one", "echo"), wf.step("two", "echo"))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        for n in (1, 2):
            await client.invoke("twice", {"n": n}, message_id=f"twice-{n}")
        listed = await run(*reach_argv(broker, "workflows", "list", "--json"))
        shown = await run(*reach_argv(broker, "workflows", "show", "twice-1", "--json"))
        refused = await run(*reach_argv(broker, "workflows", "cancel", "twice-1", "--json"))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    records = [msgspec.json.decode(line, type=WorkflowRecord) for line in lines]
    assert {r.instance_id for r in records} == {"twice-1", "twice-2"}
    assert all(r.status == "completed" and list(r.steps) == ["one", "two"] for r in records)
    one = json.loads(shown.stdout)
    assert one["instance_id"] == "twice-1" and one["result"] == {"n": 1}
    assert refused.returncode != 0 and "--json is for workflows list and show" in refused.stderr


async def test_a_signal_to_a_chain_is_not_sent(broker, start_coordinator, watcher):
    """A chain has no states: `signal` says so instead of "no state waits ... (in state -)"."""
    gate = asyncio.Event()
    agent = Agent("holder", startup_delay=0)

    @agent.handler("hold")
    async def hold(ctx: TaskContext, payload: object) -> object:
        await gate.wait()
        return payload

    flows = {"held": wf.chain(wf.step("one", "hold"))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        await client.publish("held", {}, message_id="held-1")
        await watcher.event("accepted", topic="hold")
        signalled = await run(*reach_argv(broker, "workflows", "signal", "held-1", "go"))
        gate.set()
        await watcher.event("workflow_completed", message_id="held-1")
    assert signalled.returncode == 1
    assert "not sent: 'held' is no state machine" in signalled.stdout
    assert not [e for e in watcher.events if e.event.startswith("signal_")]


async def test_a_negative_wait_is_refused(broker):
    """`--wait -1` was taken silently (an outside trial)."""
    refused = await run(*reach_argv(broker, "workflows", "signal", "x-1", "go", "--wait", "-1"))
    assert refused.returncode == 2 and "expected 0 or more seconds" in refused.stderr
