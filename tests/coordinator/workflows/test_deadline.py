"""A workflow's deadline: the earlier of its ttl_s and its starting task's ttl; nothing is
dispatched past it, and the instance ends as expired (pure: no server)."""

from __future__ import annotations

import msgspec

from agentreach.coordinator.workflows.deadline import new_record
from agentreach.coordinator.workflows.run import (
    DEADLINE,
    Dispatch,
    Finish,
    Note,
    Run,
    Timer,
)
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, Task, WorkflowRecord

CHAIN = msgspec.yaml.decode(
    b"{on_failure: compensate, ttl_s: 60,"
    b" chain: [{name: a, intent: x, compensate: ux}, {name: b, intent: y}]}",
    type=WorkflowSpec,
)


def started(*, ttl_ms: int, received_ms: int, now: int) -> tuple[WorkflowRecord, Run]:
    task = Task(
        v=1, message_id="wf1", trace_id="t1", topic="flow", ttl_ms=ttl_ms, received_ms=received_ms
    )
    record = new_record("flow", task, CHAIN, now_ms=now)
    run = Run(CHAIN, record, now)
    run.start()
    return record, run


def test_the_starting_tasks_ttl_bounds_the_workflow() -> None:
    """ttl 6000 ms, received at 1000, started at 1500: the deadline is 7000, not ttl_s; a
    longer ttl leaves ttl_s (60 s from the start) as the deadline."""
    record, run = started(ttl_ms=6_000, received_ms=1_000, now=1_500)
    assert record.deadline_ms == 7_000 and Timer(DEADLINE, 0, 7_000) in run.actions
    record, _ = started(ttl_ms=600_000, received_ms=1_000, now=1_500)
    assert record.deadline_ms == 61_500


def test_the_deadline_ends_the_instance_as_expired_saying_which_ttl() -> None:
    """Its timer fails the instance with an `expired` error naming the task's ttl, once
    the step it stopped (which has an undo) is known to have done nothing."""
    record, _ = started(ttl_ms=6_000, received_ms=1_000, now=1_000)
    timer = Run(CHAIN, record, 7_000)
    assert timer.on_timer(DEADLINE, 0)
    assert record.status == "compensating" and record.awaiting == ["a"]
    assert record.steps["a"].status == "cancelled"
    assert not any(isinstance(a, Finish) for a in timer.actions)
    refused = ErrorInfo(type="cancelled", message="not dispatched", retryable=False)
    told = Run(CHAIN, record, 7_100)
    assert told.on_result(record.steps["a"].message_id, error=refused)
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "expired" and not record.error.retryable
    assert "ttl 6000 ms of the task that started it" in record.error.message
    assert any(isinstance(a, Finish) for a in told.actions)


def test_a_result_after_the_deadline_starts_nothing_even_before_its_timer() -> None:
    """a completes at 8000, past the deadline of 7000, while the deadline's timer is still on
    its way: b is not dispatched, the instance expires, and a (done) is undone."""
    record, _ = started(ttl_ms=6_000, received_ms=1_000, now=1_000)
    late = Run(CHAIN, record, 8_000)
    assert late.on_result(record.steps["a"].message_id, output={"a": 1}, error=None)
    assert "b" not in record.steps
    assert [a.key for a in late.actions if isinstance(a, Dispatch)] == ["a-undo"]
    assert record.status == "compensating" and record.error is not None
    assert record.error.type == "expired"


def test_a_task_expired_before_its_workflow_started_dispatches_nothing() -> None:
    """Taken in again after its ttl (a redelivery): the instance ends at once as expired."""
    record, run = started(ttl_ms=1_000, received_ms=1_000, now=5_000)
    assert not [a for a in run.actions if isinstance(a, Dispatch | Timer)]
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "expired"


def test_an_instance_says_whether_any_step_began() -> None:
    """Its caller hears `ran` from it: false for one that expired before dispatching a step
    (nothing ran: refused), true once a step was dispatched, in its end's note too."""

    def ran(run: Run) -> object:
        return next(
            a.detail["ran"] for a in run.actions if isinstance(a, Note) and "ran" in a.detail
        )

    record, run = started(ttl_ms=1_000, received_ms=1_000, now=5_000)
    assert not record.steps_began and ran(run) is False
    record, _ = started(ttl_ms=6_000, received_ms=1_000, now=1_000)
    assert Run(CHAIN, record, 7_000).on_timer(DEADLINE, 0)
    refused = ErrorInfo(type="cancelled", message="not dispatched", retryable=False)
    told = Run(CHAIN, record, 7_100)  # the end waits for the step it stopped (it has an undo)
    assert told.on_result(record.steps["a"].message_id, error=refused)
    assert record.steps_began and ran(told) is True
