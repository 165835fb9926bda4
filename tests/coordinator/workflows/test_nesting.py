"""Workflows that run workflows: loops refused at start, a depth limit at run time, and
children let go with their parent."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.coordinator import ConfigError
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import WorkflowEngine
from agentreach.coordinator.workflows.actions import Abandon, Dispatch, Finish
from agentreach.coordinator.workflows.deadline import new_record
from agentreach.coordinator.workflows.nesting import (
    DEPTH_HEADER,
    MAX_DEPTH,
    check_nesting,
    child_headers,
)
from agentreach.coordinator.workflows.run import Run
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, Task


def flows(**yaml: str) -> dict[str, WorkflowSpec]:
    return {
        name: msgspec.yaml.decode(text.encode(), type=WorkflowSpec) for name, text in yaml.items()
    }


@pytest.mark.parametrize(
    ("definitions", "cycle"),
    [
        ({"w2": "chain: [{name: a, intent: fast_b}, {name: again, intent: w2}]"}, "w2 → w2"),
        (
            {
                "a": "chain: [{name: s, intent: b}]",
                "b": "fanout: {branches: [{name: x, intent: c}, {name: y, intent: z}]}",
                "c": "states: {initial: p, states: {p: {intent: a, terminal: true}}}",
            },
            "a → b → c → a",
        ),
        ({"u": "chain: [{name: s, intent: x, compensate: u}]"}, "u → u"),
        (
            {
                "f": "chain: [{name: s, intent: x, timeout_s: 1, on_timeout: fallback,"
                " fallback_intent: f}]"
            },
            "f → f",
        ),
    ],
)
def test_a_workflow_that_runs_itself_is_refused(definitions: dict[str, str], cycle: str) -> None:
    """Directly, through other workflows, or by its compensation or fallback: the error
    names the cycle and the step that closes each link."""
    with pytest.raises(ConfigError) as refused:
        check_nesting(flows(**definitions))
    assert f"cycle: {cycle}" in str(refused.value)
    assert "`$.workflows." in str(refused.value)


def test_workflows_that_share_a_child_are_no_cycle() -> None:
    """Two workflows running the same child, which runs an agent's intent: accepted."""
    check_nesting(
        flows(
            left="chain: [{name: s, intent: shared}]",
            right="chain: [{name: s, intent: shared}, {name: t, intent: left}]",
            shared="chain: [{name: s, intent: agent_work}]",
        )
    )


async def test_the_engine_refuses_a_loop_however_it_was_defined(broker) -> None:
    """Built in Python and put beside the config's: refused when the coordinator starts."""
    specs = {"w2": wf.chain(wf.step("a", "fast_b"), wf.step("b", "w2"))}
    with pytest.raises(ConfigError, match="cycle: w2 → w2"):
        WorkflowEngine(broker, specs)


def test_the_python_builder_refuses_an_empty_workflow() -> None:
    """wf.chain(), wf.steps() and a machine without states fail when built."""
    for build, message in [
        (wf.chain, "'chain' is empty"),
        (wf.steps, "'steps' is empty"),
        (lambda: wf.machine("a", {}), "a state machine needs states"),
    ]:
        with pytest.raises(ValueError, match=message):
            build()


def _start(flow: WorkflowSpec, headers: dict[str, str]) -> tuple[Run, str]:
    task = Task(v=1, message_id="child", trace_id="t", topic="deep", headers=headers)
    record = new_record("deep", task, flow, now_ms=0)
    run = Run(flow, record, 0)
    run.start()
    return run, record.status


def test_an_instance_nested_too_deep_fails_without_a_step() -> None:
    """A child MAX_DEPTH levels down runs; one more level fails at once as too_deep."""
    flow = wf.chain(wf.step("a", "x"))
    parent = Task(v=1, message_id="p", trace_id="t", topic="deep")
    assert child_headers(parent) == {DEPTH_HEADER: "1"}
    run, status = _start(flow, {DEPTH_HEADER: str(MAX_DEPTH)})
    assert status == "running" and any(isinstance(a, Dispatch) for a in run.actions)
    run, status = _start(flow, {DEPTH_HEADER: str(MAX_DEPTH + 1)})
    assert status == "failed" and not any(isinstance(a, Dispatch) for a in run.actions)
    assert run.record.error is not None and run.record.error.type == "too_deep"


def test_a_cancel_lets_every_running_step_go() -> None:
    """Cancelling an instance lists its running steps (the engine cancels those that are
    workflows); a resume after a crash lists them again."""
    flow = wf.fanout([wf.step("a", "child"), wf.step("b", "x")])
    task = Task(v=1, message_id="wf1", trace_id="t", topic="flow")
    record = new_record("flow", task, flow, now_ms=0)
    Run(flow, record, 0).start()
    cancel = Run(flow, record, 10)
    assert cancel.cancel("stop")
    assert sorted(a.key for a in cancel.actions if isinstance(a, Abandon)) == ["a", "b"]
    assert record.error is not None and record.error.message == "stop"
    again = Run(flow, record, 20)
    again.resume()
    assert sorted(a.key for a in again.actions if isinstance(a, Abandon)) == ["a", "b"]


def test_a_saga_cancelled_while_a_child_runs_undoes_itself_after_the_child() -> None:
    """The child instance is cancelled with the parent and answers once it has undone its
    own steps: the parent waits for that answer before undoing `a` and answering."""
    flow = wf.chain(
        wf.step("a", "x", compensate="ux"), wf.step("sub", "child"), on_failure="compensate"
    )
    record = new_record("flow", Task(v=1, message_id="p1", trace_id="t", topic="flow"), flow, 0)
    Run(flow, record, 0, {"child"}).start()
    Run(flow, record, 1, {"child"}).on_result(record.steps["a"].message_id, output=1, error=None)
    cancel = Run(flow, record, 2, {"child"})
    assert cancel.cancel("stop")
    assert record.status == "compensating" and record.awaiting == ["sub"]
    assert [a.key for a in cancel.actions if isinstance(a, Abandon)] == ["sub"]
    assert not any(isinstance(a, Dispatch) for a in cancel.actions)
    child_ended = Run(flow, record, 3, {"child"})
    stopped = ErrorInfo(type="cancelled", message="cancelled with its parent", retryable=False)
    assert child_ended.on_result(record.steps["sub"].message_id, error=stopped)
    assert [a.key for a in child_ended.actions if isinstance(a, Dispatch)] == ["a-undo"]
    undone = Run(flow, record, 4, {"child"})
    assert undone.on_result(record.compensations["a"].message_id, output=None, error=None)
    assert record.status == "cancelled" and any(isinstance(a, Finish) for a in undone.actions)
