"""What a workflow definition's input paths may name, and what can never be used in it:
refused or warned about when it is loaded; a path that names nothing at run time fails its
step with the path named (on a real server), instead of giving it null."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed
from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows.spec import WorkflowSpec
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, serving


def spec(yaml: str) -> WorkflowSpec:
    return msgspec.yaml.decode(yaml.encode(), type=WorkflowSpec)


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        (
            'chain: [{name: a, intent: x, input: {v: "$.b.y"}}, {name: b, intent: y}]',
            "step 'a': the input path '$.b.y' names step 'b', which does not run before 'a'",
        ),
        (
            'steps: [{name: a, intent: x}, {name: b, intent: y, input: "$.a.v"},'
            " {name: c, after: [a, b]}]",
            "step 'b': the input path '$.a.v' names step 'a', which does not run before 'b'",
        ),
        (
            'fanout: {branches: [{name: a, intent: x}, {name: b, intent: y, input: "$.a"}]}',
            "step 'b': the input path '$.a' names step 'a', which does not run before 'b'",
        ),
        (
            "states: {initial: a, states: {a: {intent: x, next: [{to: b}]},"
            ' b: {intent: y, input: "$.c.z", next: [{to: c}]}, c: {terminal: true}}}',
            "state 'b': the input path '$.c.z' names state 'c', from which 'b' cannot be reached",
        ),
        (
            "states: {initial: a, states: {a: {next: [{to: a}]}, z: {terminal: true}}}",
            "no terminal state can be reached from initial state 'a'",
        ),
    ],
)
def test_a_definition_that_cannot_work_is_refused_naming_the_step_and_path(
    tmp_path: Path, yaml: str, message: str
) -> None:
    """A path to a step that does not run before the one naming it (a later one, or one
    beside it), and a machine that can reach no terminal state, are refused at load."""
    path = tmp_path / "c.yaml"
    path.write_text(f"workflows:\n  w: {{{yaml}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value) and "$.workflows.w" in str(caught.value)


LOOSE = """
states:
  initial: a
  states:
    a:
      intent: x
      next:
        - {to: b}
        - {when: {field: ok, value: true}, to: c}
    b: {terminal: true}
    c: {terminal: true}
    orphan: {intent: y, terminal: true}
"""
WARNINGS = [
    "state 'orphan' is never entered: no transition from initial state 'a' leads to it",
    "state 'a': transition 2 (to 'c', on its 'when') is never taken: transition 1 (to 'b')"
    " has no 'when' and comes before it; put the otherwise last",
]


def test_parts_never_used_are_warned_about() -> None:
    """An unreachable state and a transition after an otherwise are warnings (the
    definition loads); an event after an otherwise still counts while the intent runs, so
    it is no warning, unless the state has no intent."""
    assert spec(LOOSE).warnings() == WARNINGS
    # Paths to earlier steps (directly or through others), to a join's parts, and to states
    # from which the naming state can be reached (itself, in a loop) load, with no warning.
    fine = [
        'chain: [{name: a, intent: x}, {name: b, intent: y}, {name: c, input: {v: "$.a.v"}}]',
        "fanout: {branches: [{name: a, intent: x}, {name: b, intent: y}],"
        ' then: {name: m, intent: z, input: {a: "$.a", r: "$.results.b"}}}',
        "states: {initial: a, states: {a: {intent: x, input: {n: '$.a.n'}, next: [{when:"
        " {field: done, value: true}, to: z}, {to: a}]}, z: {terminal: true}}}",
    ]
    assert [spec(yaml).warnings() for yaml in fine] == [[], [], []]
    events = (
        "states: {initial: a, states: {a: {%s next: [{to: b}, {event: e, to: b}]},"
        " b: {terminal: true}}}"
    )
    assert spec(events % "intent: x,").warnings() == []
    (warning,) = spec(events % "").warnings()
    assert "transition 2 (to 'b', on event 'e') is never taken" in warning


async def test_warnings_are_printed_by_routes_check_and_logged_at_start(
    tmp_path: Path, broker, start_coordinator
) -> None:
    """`reach routes check FILE` prints each warning on stderr, naming the workflow, and
    exits 0; a coordinator starting with the definition logs them."""
    path = tmp_path / "c.yaml"
    indented = "\n".join(f"    {line}" for line in LOOSE.strip().splitlines())
    path.write_text(f"workflows:\n  loose:\n{indented}\n")
    checked = await run(*reach_argv(broker, "routes", "check", str(path)))
    with capture_logs() as logs:
        async with start_coordinator(fast(workflows=load_config(path).workflows)):
            pass
    assert checked.returncode == 0, checked.stderr
    for warning in WARNINGS:
        assert f"{path}: warning: workflow 'loose': {warning}" in checked.stderr
    assert f"{path}: 2 warnings (it loads)" in checked.stderr
    logged = [e["warning"] for e in logs if e.get("workflow") == "loose" and "warning" in e]
    assert logged == WARNINGS


def _agent(seen: list[Any], gate: asyncio.Event | None = None) -> Agent:
    agent = Agent("planner", startup_delay=0)

    @agent.handler("stall")
    async def stall(ctx: TaskContext, payload: Any) -> Any:
        assert gate is not None
        await gate.wait()
        return payload

    @agent.handler("plan")
    async def plan(ctx: TaskContext, payload: Any) -> Any:
        return {"outline": ["intro"]}  # no "title"

    @agent.handler("write")
    async def write(ctx: TaskContext, payload: Any) -> Any:
        seen.append(payload)
        return payload

    return agent


FLOWS = {
    "drafted": spec(
        "chain: [{name: plan, intent: plan},"
        ' {name: write, intent: write, input: {title: "$.plan.title", topic: "$.input.topic"}}]'
    ),
    "joined": spec(
        "fanout: {branches: [{name: plan, intent: plan}, {name: slow, intent: stall,"
        " timeout_s: 0.2, on_timeout: partial}], join: {policy: all},"
        ' then: {name: write, intent: write, input: {o: "$.plan.outline", s: "$.results.slow"}}}'
    ),
    "batch": spec(
        "fanout: {branches: [{name: first, intent: write},"
        ' {name: broken, intent: write, input: "$.input.nowhere"}, {name: last, intent: write}],'
        " then: {name: merge, intent: write}}"
    ),
}


async def test_a_branch_whose_path_names_nothing_fails_the_fanout_sending_no_sibling(
    broker, start_coordinator, watcher
):
    """The middle branch cannot start: the workflow fails `input_missing` and neither the
    branch before it nor the one after reaches an agent (they used to: one was refused at
    routing, the other ran after `workflow_failed`)."""
    seen: list[Any] = []
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, _agent(seen)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("batch", {"q": 1}, message_id="batch-1")
        ended = await watcher.event("workflow_failed", message_id="batch-1")
        # Anything the failed instance sent is in intake before this: it is routed first.
        assert await client.invoke("write", {"after": 1}) == {"after": 1}
        record = await read_record(broker, "batch-1")
    assert failed.value.error.type == "input_missing"
    # Nothing was sent, so nothing ran (it said "ran": true: the first branch was begun).
    assert ended.detail["ran"] is False
    assert seen == [{"after": 1}]
    steps = [e for e in watcher.events if e.message_id.startswith("batch-1-")]
    assert [e.event for e in steps] == ["step_input_missing"]
    # It began and ended in one change: only its end says how long it took.
    started = await watcher.event("workflow_started", message_id="batch-1")
    assert "duration_ms" not in started.detail and ended.detail["duration_ms"] >= 0
    assert record is not None and record.steps["first"].status == "cancelled"
    assert "last" not in record.steps


async def test_a_path_that_names_nothing_fails_its_step_naming_the_path(
    broker, start_coordinator, watcher
):
    """plan's result has no `title`: write is not dispatched, the workflow fails with
    `input_missing` naming '$.plan.title', in the starter's error and the dead letter. A
    path into a branch its join went without (`slow`, past its timeout with `on_timeout:
    partial`) gives null: the join's `missing` says why."""
    seen: list[Any] = []
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, _agent(seen, gate)),
        ReachClient(broker=broker) as client,
    ):
        joined = await client.invoke("joined", {})
        gate.set()
        assert joined == {"o": ["intro"], "s": None} and seen == [joined]
        seen.clear()
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("drafted", {"topic": "nats"}, message_id="draft-1")
        letter = await watcher.dead_letter("workflow_failed", message_id="draft-1")
        noted = await watcher.event("step_input_missing", message_id="draft-1-write-1")
        record = await read_record(broker, "draft-1")
    error = failed.value.error
    assert error.type == "input_missing" and not error.retryable
    assert error.message == (
        "step 'write' was not started: the input path '$.plan.title' names nothing:"
        " '$.plan' (dict) has no 'title'"
    )
    assert letter.error is not None and letter.error.message == error.message
    assert noted.detail["path"] == "$.plan.title"
    assert noted.topic == "write"  # the step's intent, as its task would have had (not "drafted")
    assert record is not None and record.steps["write"].status == "failed"
    written = [e for e in watcher.events if e.message_id.startswith("draft-1-write")]
    assert seen == [] and [e.event for e in written] == ["step_input_missing"]


@pytest.mark.parametrize(
    ("yaml", "message", "at"),
    [
        (
            'fanout: {branches: [{name: web, intent: x, input: "$.results.papers"},'
            " {name: papers, intent: y}], then: {name: merge, intent: m}}",
            "step 'web': the input path '$.results.papers' names the join's 'results', which"
            " only a step after several others has (a fan-out's `then`); a path may name"
            " input, prev, or a step 'web' comes after: none",
            "$.workflows.w.fanout.branches[0].input",
        ),
        (
            'chain: [{name: a, intent: x}, {name: b, intent: y, input: "$.missing"}]',
            "step 'b': the input path '$.missing' names the join's 'missing'",
            "$.workflows.w.chain[1].input",
        ),
        (
            "fanout: {branches: [{name: web, intent: x}, {name: papers, intent: y}],"
            ' then: {name: merge, intent: m, input: "$.inptu.query"}}',
            "step 'merge': the input path '$.inptu.query' names no step; did you mean"
            " 'input'? (a path here starts at input, missing, papers, prev, results, web)",
            "$.workflows.w.fanout.then.input",
        ),
        (
            "fanout: {branches: [{name: web, intent: x, input: {q: '$.inptu.query'}},"
            " {name: papers, intent: y}], then: {name: merge, intent: m}}",
            "names no step; did you mean 'input'? (a path here starts at input, prev)",
            "$.workflows.w.fanout.branches[0].input",
        ),
        (
            "states: {initial: a, states: {a: {intent: x, next: [{to: b}]},"
            ' b: {intent: y, input: "$.results.a", next: [{to: c}]}, c: {terminal: true}}}',
            "state 'b': the input path '$.results.a' names the join's 'results', which a"
            " state never has (a path may name input, prev, or a state before 'b': 'a')",
            "$.workflows.w.states.states.b.input",
        ),
    ],
)
def test_a_path_a_step_cannot_have_is_refused_with_what_it_may_name_and_where(
    tmp_path: Path, yaml: str, message: str, at: str
) -> None:
    """A join's results / missing outside a join, and a name that is nothing (a typo), are
    refused at load: the hint lists only what that step's paths may start at, suggests the
    closest, and the location is the step's input."""
    path = tmp_path / "c.yaml"
    path.write_text(f"workflows:\n  w: {{{yaml}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value) and f"- at `{at}`" in str(caught.value)


def test_a_timeout_or_wait_past_the_workflows_ttl_is_warned_about() -> None:
    """A `timeout_s` or `wait_s` at or past the workflow's `ttl_s` is never reached: the
    instance expires first (it loaded without a word)."""
    chain = spec("{ttl_s: 100, chain: [{name: a, intent: x, timeout_s: 1000000}, {name: b}]}")
    assert chain.warnings() == [
        "'a': timeout_s 1e+06 s is never reached: the workflow's ttl_s 100 s ends it first"
    ]
    machine = spec(
        "{ttl_s: 60, states: {initial: a, states: {a: {wait_s: 60, next: [{event: e, to: b}]},"
        " b: {terminal: true}}}}"
    )
    assert machine.warnings() == [
        "'a': wait_s 60 s is never reached: the workflow's ttl_s 60 s ends it first"
    ]
    assert spec("{ttl_s: 100, chain: [{name: a, intent: x, timeout_s: 99}]}").warnings() == []


def test_a_ttl_past_the_longest_task_ttl_is_warned_about() -> None:
    """An instance ends by the ttl of the task that started it too, which is a day at most:
    `ttl_s: 99999999999` loaded without a word (an outside trial)."""
    assert spec("{ttl_s: 99999999999, chain: [{name: a, intent: x}]}").warnings() == [
        "ttl_s 1e+11 s is never reached: the ttl of the task that starts an instance ends it"
        " first, and a task's ttl is at most 86400 s (a day)"
    ]
    assert spec("{ttl_s: 86400, chain: [{name: a, intent: x}]}").warnings() == []


def test_a_compensate_never_used_and_a_repeated_event_are_warned_about() -> None:
    """`compensate:` without `on_failure: compensate` never runs; a second transition on an
    event the state already goes on is never taken; a second otherwise is described as one."""
    chain = spec("chain: [{name: a, intent: x, compensate: ux}, {name: b, intent: y}]")
    assert chain.warnings() == [
        "step 'a': 'compensate: ux' is never used: the workflow has no 'on_failure: compensate'"
    ]
    machine = spec(
        "states: {initial: a, states: {a: {intent: x, next: [{event: e, to: b},"
        " {event: e, to: c}, {to: b}, {to: c}]}, b: {terminal: true}, c: {terminal: true}}}"
    )
    assert machine.warnings() == [
        "state 'a': transition 4 (to 'c', with no 'when' either) is never taken: transition 3"
        " (to 'b') has no 'when' and comes before it; put the otherwise last",
        "state 'a': transition 2 (to 'c', on event 'e') is never taken: transition 1 (to 'b')"
        " is on the same event and comes before it",
    ]
    saga = spec("on_failure: compensate\nchain: [{name: a, intent: x, compensate: ux}]")
    assert saga.warnings() == []
