"""Steps an instance stopped while they ran, whose task completes all the same: with a saga
they are undone, before the answer when the instance ends badly, and without changing how
it ended (pure run logic: the actions each event calls for)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from agentreach.agents import Agent, PermanentError, ReachClient, TaskContext, TaskFailed
from agentreach.broker import read_stream
from agentreach.cli.workflow_views import tree
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows.outbox import Outbox
from agentreach.coordinator.workflows.run import Finish, Run, Timer
from agentreach.coordinator.workflows.saga import LATE, LATE_GRACE_MS
from agentreach.envelopes import ErrorInfo
from tests.coordinator.workflows.test_run import dispatched, spec, started, step
from tests.e2e.routing_support import fast, serving
from tests.e2e.test_workflows import _until_record, workflows

ANY_JOIN = spec(
    "on_failure: compensate\n"
    "fanout: {branches: [{name: a, intent: x, compensate: ux},"
    " {name: b, intent: y, compensate: uy}], join: {policy: any},"
    " then: {name: merge, intent: m}}"
)


def test_a_branch_the_join_went_without_is_undone_when_it_completes_late() -> None:
    """The join went on with b and the workflow completed; a completes after: a alone is
    undone, once (b and merge are not), the workflow stays completed and answers no second
    time, and show says a completed, then undone."""
    record, _ = started(ANY_JOIN)
    step(record, ANY_JOIN, "b", output={"b": 1})
    step(record, ANY_JOIN, "merge", output={"m": 1}, now=2_500)
    assert record.status == "completed" and record.steps["a"].status == "cancelled"
    late = Run(ANY_JOIN, record, 5_000)
    assert late.on_result(record.steps["a"].message_id, output={"a": 1}, error=None)
    assert dispatched(late) == ["a-undo"] and record.status == "completed"
    again = Run(ANY_JOIN, record, 5_100)  # the result delivered again: undone once
    assert not again.on_result(record.steps["a"].message_id, output={"a": 1}, error=None)
    assert record.steps["a"].status == "completed" and not any(
        isinstance(a, Finish) for a in late.actions
    )
    undone = Run(ANY_JOIN, record, 5_500)
    assert undone.on_result(record.compensations["a"].message_id, output=None, error=None)
    assert dispatched(undone) == [] and undone.actions == []
    assert record.status == "completed" and record.result == {"m": 1}
    shown = tree(record)
    assert "a              completed" in shown and "undo a         completed" in shown


def test_a_resumed_completed_workflow_dispatches_its_late_undo_again() -> None:
    """A crash between the record's write and the undo's dispatch loses nothing."""
    record, _ = started(ANY_JOIN)
    step(record, ANY_JOIN, "b", output={"b": 1})
    step(record, ANY_JOIN, "merge", output={"m": 1}, now=2_500)
    Run(ANY_JOIN, record, 5_000).on_result(record.steps["a"].message_id, output=1, error=None)
    again = Run(ANY_JOIN, record, 6_000)
    again.resume()
    assert dispatched(again) == ["a-undo"]


TIMED = spec(
    "on_failure: compensate\n"
    "chain: [{name: a, intent: x, compensate: ux},"
    " {name: b, intent: y, compensate: uy, timeout_s: 1}]"
)


def test_a_step_that_timed_out_is_waited_for_and_undone_before_the_answer() -> None:
    """b's timeout fails the workflow: nothing is undone until b's outcome is known (for
    its timeout and the grace); b completes, so b is undone first, then a, and only then
    is the starter answered."""
    record, _ = started(TIMED)
    step(record, TIMED, "a", output={"a": 1})
    b = record.steps["b"]
    timer = Run(TIMED, record, b.deadline_ms)
    assert timer.on_timer("b", b.visit)
    assert b.status == "timed_out" and dispatched(timer) == []
    assert record.status == "compensating" and record.awaiting == ["b"]
    assert Timer("b" + LATE, 1, 3_000 + LATE_GRACE_MS) in timer.actions
    assert not any(isinstance(a, Finish) for a in timer.actions)
    late = Run(TIMED, record, 3_500)
    assert late.on_result(b.message_id, output={"b": 2}, error=None)
    assert dispatched(late) == ["b-undo"]
    undo_b = Run(TIMED, record, 3_600)
    undo_b.on_result(record.compensations["b"].message_id, error=None)
    assert dispatched(undo_b) == ["a-undo"] and record.status == "compensating"
    undo_a = Run(TIMED, record, 3_700)
    undo_a.on_result(record.compensations["a"].message_id, error=None)
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "timeout" and Finish() in undo_a.actions


def test_a_timed_out_step_silent_past_the_grace_is_undone_last() -> None:
    """b says nothing by its timeout and the grace: a is undone and the workflow ends; b
    completing later still is undone then, without a second end."""
    record, _ = started(TIMED)
    step(record, TIMED, "a", output={"a": 1})
    Run(TIMED, record, 3_000).on_timer("b", 1)
    gave_up = Run(TIMED, record, 3_000 + LATE_GRACE_MS)
    assert gave_up.on_timer("b" + LATE, 1) and dispatched(gave_up) == ["a-undo"]
    Run(TIMED, record, 8_500).on_result(record.compensations["a"].message_id, error=None)
    assert record.status == "failed"
    late = Run(TIMED, record, 10_000)
    assert late.on_result(record.steps["b"].message_id, output={"b": 2}, error=None)
    assert dispatched(late) == ["b-undo"] and not any(isinstance(a, Finish) for a in late.actions)


def test_a_state_that_timed_out_is_waited_for_before_the_undoing() -> None:
    """The same in a state machine: a state's intent past its timeout_s, no on_timeout."""
    flow = spec(
        "on_failure: compensate\n"
        "states: {initial: s, states: {s: {intent: x, compensate: ux, next: [{to: t}]},"
        " t: {intent: y, compensate: uy, timeout_s: 1, next: [{to: end}]},"
        " end: {terminal: true}}}"
    )
    record, _ = started(flow)
    step(record, flow, "s", output={"s": 1})
    timer = Run(flow, record, 3_000)
    assert timer.on_timer("t", 1)
    assert dispatched(timer) == [] and record.awaiting == ["t"]


PARTIAL = spec(
    "on_failure: compensate\n"
    "fanout: {branches: [{name: a, intent: x, compensate: ux, timeout_s: 1,"
    " on_timeout: partial}, {name: b, intent: y}], then: {name: merge, intent: m}}"
)


def test_a_branch_past_its_timeout_that_completes_while_the_instance_runs_is_undone() -> None:
    """a timed out (`on_timeout: partial`: the join goes on without it) and merge runs; a
    completes after all: its effect is in no result, so it is undone at once (it used to be
    dropped, its effect left in place); merge then completes the workflow as usual."""
    record, _ = started(PARTIAL)
    a = record.steps["a"]
    assert Run(PARTIAL, record, a.deadline_ms).on_timer("a", a.visit)
    step(record, PARTIAL, "b", output={"b": 1}, now=a.deadline_ms + 10)
    assert record.steps["merge"].status == "running" and a.status == "timed_out"
    late = Run(PARTIAL, record, a.deadline_ms + 20)
    assert late.on_result(a.message_id, output={"a": 1}, error=None)
    assert dispatched(late) == ["a-undo"] and record.status == "running"
    step(record, PARTIAL, "merge", output={"m": 1}, now=a.deadline_ms + 30)
    assert record.status == "completed" and record.result == {"m": 1}
    undone = Run(PARTIAL, record, a.deadline_ms + 40)
    assert undone.on_result(record.compensations["a"].message_id, output=None, error=None)
    assert record.status == "completed" and dispatched(undone) == []


def test_a_branch_stopped_while_it_ran_that_then_fails_is_shown_failed() -> None:
    """a fails for good, so the instance fails and b, running, is stopped and awaited; b then
    fails too. It showed `cancelled` beside its own error: it ran and failed."""
    both = spec(
        "on_failure: compensate\n"
        "fanout: {branches: [{name: a, intent: x, compensate: ux},"
        " {name: b, intent: y, compensate: uy}]}"
    )
    record, _ = started(both)
    refused = ErrorInfo(type="PermanentError", message="work refused", retryable=False)
    step(record, both, "a", error=refused)
    assert record.steps["b"].status == "cancelled" and record.awaiting == ["b"]
    late = Run(both, record, 4_000)
    assert late.on_result(record.steps["b"].message_id, output=None, error=refused)
    assert record.steps["b"].status == "failed" and record.steps["b"].error == refused
    assert record.awaiting == []


FALLBACK = spec(
    "on_failure: compensate\n"
    "chain: [{name: h, intent: slow, timeout_s: 1, on_timeout: fallback, fallback_intent: quick,"
    " compensate: undo_h}, {name: boom, intent: fails}]"
)


def test_a_step_s_first_run_replaced_by_its_fallback_is_waited_for_and_undone_first() -> None:
    """h's first run timed out and its fallback ran in its place; then the instance failed.
    The first run, still running, completed after the undoing: it was never undone (the
    record knew only the fallback's visit), and the starter was answered before. It is
    waited for like a step stopped while it ran, and undone first, by an undo of its own."""
    record, _ = started(FALLBACK)
    first = record.steps["h"]
    timeout = Run(FALLBACK, record, 2_000)
    assert timeout.on_timer("h", 1)
    assert dispatched(timeout) == ["h"] and record.steps["h"].visit == 2
    step(record, FALLBACK, "h", output={"via": "fallback"}, now=2_100)
    failed = ErrorInfo(type="PermanentError", message="no", retryable=False)
    failing = step(record, FALLBACK, "boom", error=failed, now=2_200)
    assert record.status == "compensating" and record.awaiting == ["h@1"]
    assert dispatched(failing) == [] and not any(isinstance(a, Finish) for a in failing.actions)
    late = Run(FALLBACK, record, 4_000)
    assert late.on_result(first.message_id, output={"via": "slow"}, error=None)
    assert dispatched(late) == ["h@1-undo"]
    assert record.compensations["h@1"].message_id == "wf1-h-undo1"
    assert record.compensations["h@1"].intent == "undo_h"
    then = Run(FALLBACK, record, 4_500)
    assert then.on_result(record.compensations["h@1"].message_id, output=None, error=None)
    assert dispatched(then) == ["h-undo"]
    done = Run(FALLBACK, record, 5_000)
    assert done.on_result(record.compensations["h"].message_id, output=None, error=None)
    assert record.status == "failed"
    assert [a for a in done.actions if isinstance(a, Finish)] == [Finish()]


def test_a_fallback_s_first_run_done_after_the_instance_completed_is_undone_alone() -> None:
    """The instance completed on the fallback's result; the first run completes later:
    its effect is undone, the instance stays completed."""
    definition = spec(
        "on_failure: compensate\n"
        "chain: [{name: h, intent: slow, timeout_s: 1, on_timeout: fallback,"
        " fallback_intent: quick, compensate: undo_h}]"
    )
    record, _ = started(definition)
    first = record.steps["h"]
    assert Run(definition, record, 2_000).on_timer("h", 1)
    step(record, definition, "h", output={"via": "fallback"}, now=2_100)
    assert record.status == "completed"
    late = Run(definition, record, 4_000)
    assert late.on_result(first.message_id, output={"via": "slow"}, error=None)
    assert dispatched(late) == ["h@1-undo"] and record.status == "completed"


LOOP = spec(
    "on_failure: compensate\n"
    "states:\n"
    "  initial: pay\n"
    "  states:\n"
    "    pay: {intent: charge, compensate: refund, next: [{to: hold}]}\n"
    "    hold: {next: [{event: again, to: pay}, {event: fail, to: boom}]}\n"
    "    boom: {intent: fails, next: [{to: done}]}\n"
    "    done: {terminal: true}\n"
)


def test_each_visit_of_a_state_entered_again_is_undone_latest_first() -> None:
    """pay ran three times (a loop through hold); boom failed: only pay's last visit was
    refunded, two charges stood. Each visit is undone, latest first, then the instance
    answers as failed."""
    record, _ = started(LOOP)
    for n, now in ((1, 2_000), (2, 3_000), (3, 4_000)):
        step(record, LOOP, "pay", output={"charge": n}, now=now)
        assert Run(LOOP, record, now + 100).on_signal("again" if n < 3 else "fail")
    failed = ErrorInfo(type="PermanentError", message="no", retryable=False)
    compensating = step(record, LOOP, "boom", error=failed, now=5_000)
    assert dispatched(compensating) == ["pay-undo"]
    undone = []
    for key in ("pay", "pay@2", "pay@1"):
        run = record.compensations[key]
        undone.append((run.message_id, run.visit))
        after = Run(LOOP, record, 6_000)
        assert after.on_result(run.message_id, output=None, error=None)
    assert undone == [("wf1-pay-undo", 3), ("wf1-pay-undo2", 2), ("wf1-pay-undo1", 1)]
    assert record.status == "failed"
    shown = tree(record)
    assert "pay@1" in shown and "undo pay@2" in shown


TIMED_LOOP = spec(
    "on_failure: compensate\n"
    "states:\n"
    "  initial: pay\n"
    "  states:\n"
    "    pay: {intent: charge, compensate: refund, timeout_s: 1, on_timeout: hold,"
    " next: [{to: hold}]}\n"
    "    hold: {next: [{event: again, to: pay}, {event: stop, to: done}]}\n"
    "    done: {terminal: true}\n"
)


def test_a_state_that_timed_out_and_completed_late_while_the_machine_ran_is_undone() -> None:
    """pay timed out (on to hold) and its charge completed while the machine waited in
    hold: the late result was dropped, and a cancel then refunded nothing."""
    record, _ = started(TIMED_LOOP)
    first = record.steps["pay"]
    assert Run(TIMED_LOOP, record, 2_000).on_timer("pay", 1)
    assert record.current == "hold"
    late = Run(TIMED_LOOP, record, 2_500)
    assert late.on_result(first.message_id, output={"charge": 1}, error=None)
    assert dispatched(late) == []  # the machine goes on: its effect stands for now
    cancel = Run(TIMED_LOOP, record, 3_000)
    assert cancel.cancel()
    assert dispatched(cancel) == ["pay-undo"]


def test_a_timed_out_visit_of_a_state_entered_again_is_undone_when_it_completes_late() -> None:
    """pay's first visit timed out, the machine came back to pay, whose second visit
    completed; the first visit's charge came after the cancel: it was lost with the visit
    the second replaced. Both are undone."""
    record, _ = started(TIMED_LOOP)
    first = record.steps["pay"]
    assert Run(TIMED_LOOP, record, 2_000).on_timer("pay", 1)
    assert Run(TIMED_LOOP, record, 2_100).on_signal("again")
    step(record, TIMED_LOOP, "pay", output={"charge": 2}, now=2_200)
    cancel = Run(TIMED_LOOP, record, 3_000)
    assert cancel.cancel()
    assert record.awaiting == ["pay@1"] and dispatched(cancel) == []
    late = Run(TIMED_LOOP, record, 3_500)
    assert late.on_result(first.message_id, output={"charge": 1}, error=None)
    assert dispatched(late) == ["pay@1-undo"]
    then = Run(TIMED_LOOP, record, 4_000)
    assert then.on_result(record.compensations["pay@1"].message_id, output=None, error=None)
    assert dispatched(then) == ["pay-undo"]


async def test_the_late_outcome_of_a_replaced_visit_is_said_of_that_visit(broker) -> None:
    """The outbox looked a note's step up among the latest visits only: `pay@1`'s
    `compensating_late_step` raised KeyError, and the actions after it (the undo's
    dispatch) were never carried out (an outside drill: instances stuck `compensating`, or
    `cancelled` with no `workflow_cancelled`, till a restart)."""
    record, _ = started(TIMED_LOOP)
    first = record.steps["pay"]
    assert Run(TIMED_LOOP, record, 2_000).on_timer("pay", 1)
    assert Run(TIMED_LOOP, record, 2_100).on_signal("again")
    step(record, TIMED_LOOP, "pay", output={"charge": 2}, now=2_200)
    assert Run(TIMED_LOOP, record, 3_000).cancel()
    late = Run(TIMED_LOOP, record, 3_500)
    assert late.on_result(first.message_id, output={"charge": 1}, error=None)
    await Outbox(broker, lambda record: {}, lambda: 3_500).carry_out(record, late.actions)
    names = broker.names
    said = await read_stream(
        broker, names.events_stream, names.events_of_kind("compensating_late_step")
    )
    undo = await read_stream(broker, names.tasks_stream, names.tasks_wildcard)
    assert [msgspec.json.decode(m.data)["message_id"] for m in said] == [first.message_id]
    assert [msgspec.json.decode(m.data)["message_id"] for m in undo] == ["wf1-pay-undo1"]


SKIPPABLE_LOOP = spec(
    "on_failure: compensate\n"
    "states:\n"
    "  initial: pay\n"
    "  states:\n"
    "    pay: {intent: charge, compensate: refund, next: [{event: skip, to: hold}, {to: hold}]}\n"
    "    hold: {next: [{event: again, to: pay}, {event: stop, to: done}]}\n"
    "    done: {terminal: true}\n"
)
REFUSED = ErrorInfo(type="cancelled", message="not dispatched", retryable=False)


def test_a_stopped_visit_refused_before_a_cancel_is_not_waited_for() -> None:
    """A signal moved pay on while it ran and its task was refused; pay ran again and
    completed. A cancel then waited for the first visit's outcome until its deadline (an
    outside drill: 26 s before `gave_up`), though that outcome had come: a refusal."""
    record, _ = started(SKIPPABLE_LOOP)
    first = record.steps["pay"]
    assert Run(SKIPPABLE_LOOP, record, 1_500).on_signal("skip")
    assert first.status == "cancelled"
    refused = Run(SKIPPABLE_LOOP, record, 1_600)
    assert refused.on_result(first.message_id, error=REFUSED)
    assert first.status == "failed" and first.error == REFUSED
    assert Run(SKIPPABLE_LOOP, record, 1_700).on_signal("again")
    step(record, SKIPPABLE_LOOP, "pay", output={"charge": 2}, now=2_000)
    cancel = Run(SKIPPABLE_LOOP, record, 3_000)
    assert cancel.cancel()
    assert record.awaiting == [] and "pay@1" not in record.replaced
    assert dispatched(cancel) == ["pay-undo"]


def test_a_timed_out_visit_refused_before_a_cancel_is_not_waited_for() -> None:
    """The same with a visit that timed out: its task's refusal is its outcome."""
    record, _ = started(TIMED_LOOP)
    first = record.steps["pay"]
    assert Run(TIMED_LOOP, record, 2_000).on_timer("pay", 1)
    assert Run(TIMED_LOOP, record, 2_050).on_result(first.message_id, error=REFUSED)
    assert Run(TIMED_LOOP, record, 2_100).on_signal("again")
    step(record, TIMED_LOOP, "pay", output={"charge": 2}, now=2_200)
    cancel = Run(TIMED_LOOP, record, 3_000)
    assert cancel.cancel()
    assert record.awaiting == [] and dispatched(cancel) == ["pay-undo"]


def test_a_replaced_visit_refused_after_its_replacement_is_not_waited_for() -> None:
    """h's first run timed out, its fallback ran, and then the first run's task was
    refused: a failure of the instance undoes at once, waiting for nothing."""
    record, _ = started(FALLBACK)
    first = record.steps["h"]
    assert Run(FALLBACK, record, 2_000).on_timer("h", 1)
    assert Run(FALLBACK, record, 2_050).on_result(first.message_id, error=REFUSED)
    assert record.replaced["h@1"].status == "failed"
    step(record, FALLBACK, "h", output={"via": "fallback"}, now=2_100)
    failed = ErrorInfo(type="PermanentError", message="no", retryable=False)
    failing = step(record, FALLBACK, "boom", error=failed, now=2_200)
    assert record.awaiting == [] and dispatched(failing) == ["h-undo"]


SKIP_AND_COME_BACK = """
on_failure: compensate
states:
  initial: pay
  states:
    pay: {intent: late-charge, compensate: late-refund, next: [{event: skip, to: hold}, {to: hold}]}
    hold: {next: [{event: again, to: pay}, {event: stop, to: done}]}
    done: {terminal: true}
"""


async def test_a_cancel_after_a_refused_visit_undoes_at_once(broker, start_coordinator) -> None:
    """Through NATS: pay is skipped while it runs, its task then fails, pay runs again and
    completes; a cancel refunds the second charge at once, waiting for no outcome (the first
    visit's had come), and the caller hears `cancelled`."""
    charges: list[int] = []
    first_charging, first_may_fail = asyncio.Event(), asyncio.Event()
    agent = Agent("late-charger", startup_delay=0)

    @agent.handler("late-charge")
    async def charge(ctx: TaskContext, payload: Any) -> Any:
        charges.append(len(charges) + 1)
        if len(charges) == 1:
            first_charging.set()
            await first_may_fail.wait()
            raise PermanentError("card declined")
        return {"charge": len(charges)}

    @agent.handler("late-refund")
    async def refund(ctx: TaskContext, payload: Any) -> Any:
        return {"refunded": True}

    config = fast(workflows=workflows(skipper=SKIP_AND_COME_BACK))
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker, name="skipper-caller") as caller,
    ):
        instance = "skipper-1"
        invoked = asyncio.create_task(caller.invoke("skipper", {}, message_id=instance))
        # the skip must find visit 1 at the agent: one found still queued is refused unrun
        await asyncio.wait_for(first_charging.wait(), 10)
        assert (await caller.signal_workflow(instance, "skip")).taken
        first_may_fail.set()
        await _until_record(broker, instance, lambda r: r.steps["pay"].status == "failed")
        assert (await caller.signal_workflow(instance, "again")).taken
        await _until_record(broker, instance, lambda r: r.current == "hold")
        ended = await caller.cancel_workflow(instance, wait_s=10)
        record = await read_record(broker, instance)
        with pytest.raises(TaskFailed) as heard:
            await asyncio.wait_for(invoked, 10)
    assert heard.value.error.type == "cancelled"
    assert ended.status == "cancelled" and charges == [1, 2]
    assert record is not None and list(record.compensations) == ["pay"]
    assert record.compensations["pay"].visit == 2 and record.replaced == {}
