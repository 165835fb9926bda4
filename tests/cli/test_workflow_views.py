"""`reach workflows list` and `show` as tables and trees (pure: records made here)."""

from __future__ import annotations

from agentreach.cli.workflows import table, tree
from agentreach.envelopes import StepRun, Task, WorkflowRecord


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


def test_a_step_stopped_while_it_ran_says_its_outcome_is_awaited():
    """It read `cancelled` while it still ran, then flipped to `completed`."""
    steps = {"reserve": StepRun(status="cancelled", intent="reserve", started_ms=1)}
    shown = tree(record(status="compensating", steps=steps, awaiting=["reserve"], started_ms=1))
    line = next(
        ln for ln in shown.splitlines() if ln.lstrip().startswith(("├─ reserve", "└─ reserve"))
    )
    assert "its outcome is awaited, then undone" in line
