"""The chaos run's account of its workflows: every instance ended, each sent step once."""

from __future__ import annotations

from agentreach.envelopes import ErrorInfo, StepRun, Task, WorkflowRecord
from agentreach.envelopes.coordination import WorkflowStatus
from tests.chaos.flows import FLOW, account_flows
from tests.chaos.recorder import TOPIC
from tests.chaos.test_accounting import LIVE_PID, run


def instance(key: str, status: WorkflowStatus, *steps: str) -> WorkflowRecord:
    task = Task(v=1, message_id=key, trace_id=key, topic=FLOW)
    sent = {s: StepRun(status="completed", message_id=f"{key}-{s}", intent=TOPIC) for s in steps}
    error = ErrorInfo(type="expired", message="ttl") if status == "failed" else None
    record = WorkflowRecord(instance_id=key, workflow=FLOW, trace_id=key, task=task, steps=sent)
    record.status, record.error = status, error
    return record


def test_an_instance_not_ended_and_a_step_run_twice_are_problems() -> None:
    """`done` ended with both steps run once; `stuck` still runs, its step `two` never run
    (lost); `failed` ended for a reason (a row, not a problem); `twice` ran step `one` twice
    on an agent nobody killed; `gone` has no record at all."""
    records = {
        "done": instance("done", "completed", "one", "two"),
        "stuck": instance("stuck", "running", "one", "two"),
        "failed": instance("failed", "failed", "one"),
        "twice": instance("twice", "completed", "one"),
    }
    agents = [
        *run("done-one", LIVE_PID, 1.0, 1.1),
        *run("done-two", LIVE_PID, 1.2, 1.3),
        *run("stuck-one", LIVE_PID, 1.0, 1.1),
        *run("failed-one", LIVE_PID, 1.0, 1.1),
        *run("twice-one", LIVE_PID, 1.0, 1.1),
        *run("twice-one", LIVE_PID, 5.0, 5.1),
    ]
    sent = ["done", "stuck", "failed", "twice", "gone"]
    result = account_flows(sent, records, agents, [], [])
    assert (result.completed, dict(result.failed)) == (2, {"expired": 1})
    assert [line.split(":")[0] for line in result.unended] == ["stuck", "gone"]
    assert result.steps.lost == ["stuck-two"]
    assert result.steps.duplicated_other == ["twice-one"]
    problems = "\n".join(result.problems())
    assert (
        "2 workflows not ended" in problems and "stuck: running; steps: one completed" in problems
    )
    assert "1 workflow steps lost" in problems and "1 workflow steps ran twice" in problems
