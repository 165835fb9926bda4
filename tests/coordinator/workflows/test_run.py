"""Workflow definitions and the pure run logic: no server, the actions each event calls for."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agentreach.cli.workflow_views import tree
from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.coordinator.workflows.deadline import new_record
from agentreach.coordinator.workflows.run import (
    DEADLINE,
    Dispatch,
    Finish,
    Note,
    Run,
    Timer,
    WorkflowRecord,
)
from agentreach.coordinator.workflows.saga import LATE, LATE_GRACE_MS
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.coordinator.workflows.templates import MissingPath, render
from agentreach.envelopes import ErrorInfo, Task, WorkflowStep
from agentreach.envelopes.coordination import workflow_step_of


def spec(yaml: str) -> WorkflowSpec:
    return msgspec.yaml.decode(yaml.encode(), type=WorkflowSpec)


def started(definition: WorkflowSpec, payload: Any = None) -> tuple[WorkflowRecord, Run]:
    task = Task(v=1, message_id="wf1", trace_id="t1", topic="flow", payload=payload)
    record = new_record("flow", task, definition, now_ms=1_000)
    run = Run(definition, record, 1_000)
    run.start()
    return record, run


def dispatched(run: Run) -> list[str]:
    return [a.key for a in run.actions if isinstance(a, Dispatch)]


def step(record: WorkflowRecord, definition: WorkflowSpec, name: str, output: Any = None,
         error: ErrorInfo | None = None, now: int = 2_000) -> Run:  # fmt: off
    run = Run(definition, record, now)
    assert run.on_result(record.steps[name].message_id, output=output, error=error)
    return run


def test_templates_pick_paths_and_keep_literals() -> None:
    """ "$.a.b" is a path into the context; other values stay as they are; a null that is
    there is a value."""
    context = {"input": {"topic": "x", "tag": None}, "plan": {"outline": [1, 2]}}
    template = {"o": "$.plan.outline", "first": "$.plan.outline.0", "t": "$.input.topic", "k": 3}
    assert render(template, context) == {"o": [1, 2], "first": 1, "t": "x", "k": 3}
    assert render("$.input.tag", context) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("$.plan.summary", "'$.plan' (dict) has no 'summary'"),
        ("$.plan.outline.5", "'$.plan.outline' (list) has no '5'"),
        ("$.input.tag.name", "'$.input.tag' (null) has no 'name'"),
        ("$.web.items", "'web' has no value"),
    ],
)
def test_a_path_that_names_nothing_is_refused_saying_which_part(path: str, why: str) -> None:
    """At run time a path that names nothing raises, naming the path and the missing part,
    instead of giving null; a path into a step its join went without gives null."""
    context = {"input": {"tag": None}, "plan": {"outline": [1, 2]}, "results": {}}
    with pytest.raises(MissingPath) as caught:
        render({"x": [path]}, context)
    assert str(caught.value) == f"the input path '{path}' names nothing: {why}" or (
        why in str(caught.value) and path in str(caught.value)
    )
    skipped = frozenset({"web"})
    assert render({"w": "$.web.items", "r": "$.results.web"}, context, skipped) == {
        "w": None,
        "r": None,
    }


def test_a_chain_dispatches_one_step_at_a_time() -> None:
    """Each step starts when the one before completed, with its output as input."""
    flow = spec("chain: [{name: a, intent: x}, {name: b, intent: y}]")
    record, run = started(flow, {"n": 1})
    assert dispatched(run) == ["a"] and record.steps["a"].input == {"n": 1}
    assert Timer(DEADLINE, 0, 31_000) in run.actions  # the task's ttl (30 s) ends before ttl_s
    after_a = step(record, flow, "a", {"n": 2})
    assert dispatched(after_a) == ["b"] and record.steps["b"].input == {"n": 2}
    after_b = step(record, flow, "b", "done")
    assert record.status == "completed" and record.result == "done"
    assert any(isinstance(a, Finish) for a in after_b.actions)
    assert record.steps["b"].message_id == message_id_of("wf1", "b", 1) == "wf1-b-1"


def test_a_result_for_an_unknown_or_finished_step_changes_nothing() -> None:
    """Late and duplicate replies are recognised and ignored."""
    flow = spec("chain: [{name: a, intent: x}]")
    record, _ = started(flow)
    step(record, flow, "a", 1)
    again = Run(flow, record, 3_000)
    assert not again.on_result("wf1-a-1", output=2, error=None)
    assert not again.on_result("someone-else", output=2, error=None)
    assert record.result == 1


def test_fallback_on_timeout_runs_another_intent_as_a_new_visit() -> None:
    """on_timeout: fallback dispatches fallback_intent with a new message id."""
    flow = spec(
        "chain: [{name: a, intent: x, timeout_s: 1, on_timeout: fallback, fallback_intent: z}]"
    )
    record, _ = started(flow)
    timer = Run(flow, record, 2_500)
    assert timer.on_timer("a", 1)
    assert record.steps["a"].intent == "z" and record.steps["a"].message_id == "wf1-a-2"
    assert dispatched(timer) == ["a"]
    assert not Run(flow, record, 2_600).on_timer("a", 1)  # the old visit's timer is stale


def test_any_join_takes_the_first_and_a_failure_is_tolerated() -> None:
    """policy any: one failed branch is fine; the first success starts the join step."""
    flow = spec(
        "fanout: {branches: [{name: a, intent: x}, {name: b, intent: y}],"
        " join: {policy: any}, then: {name: j, intent: j}}"
    )
    record, run = started(flow)
    assert sorted(dispatched(run)) == ["a", "b"]
    failed = step(record, flow, "a", error=ErrorInfo(type="boom", message="no"))
    assert record.status == "running" and dispatched(failed) == []
    joined = step(record, flow, "b", [1])
    assert dispatched(joined) == ["j"]
    assert record.steps["j"].input == {"results": {"b": [1]}, "missing": {"a": "no"}}


def test_an_impossible_quorum_fails_the_workflow() -> None:
    """quorum 2 of 2 with one failure cannot be met: the workflow fails at once."""
    flow = spec(
        "fanout: {branches: [{name: a, intent: x}, {name: b, intent: y}],"
        " join: {policy: quorum, quorum: 2}}"
    )
    record, _ = started(flow)
    step(record, flow, "a", error=ErrorInfo(type="boom", message="no"))
    assert record.status == "failed"
    assert record.error is not None and record.error.type == "join_failed"


def test_a_state_machine_without_a_matching_transition_fails() -> None:
    """No transition matching the result is a failure that says so."""
    flow = spec(
        "states: {initial: s, states: {s: {intent: x, next: [{when: {field: ok, value: true},"
        " to: t}]}, t: {terminal: true}}}"
    )
    record, _ = started(flow)
    step(record, flow, "s", {"ok": False})
    assert record.status == "failed"
    assert record.error is not None and "no transition from state 's'" in record.error.message


def test_a_state_machine_loop_is_cut_off() -> None:
    """A machine that keeps going round fails when it would enter a 101st state (it said
    "more than 100 state changes" with 100 states, 99 changes, in its path)."""
    flow = spec(
        "states: {initial: a, states: {a: {next: [{when: {field: stop, value: true}, to: z},"
        " {to: a}]}, z: {terminal: true}}}"
    )
    record, _ = started(flow)
    assert record.status == "failed"
    assert record.error is not None and record.error.type == "too_many_states"
    assert record.error.message == "it would enter more than 100 states: a loop?"
    assert len(record.path) == 100


def test_resume_lists_what_the_record_calls_for() -> None:
    """After a crash, resume repeats the running steps' dispatches and timers."""
    flow = spec("chain: [{name: a, intent: x, timeout_s: 5}, {name: b, intent: y}]")
    record, _ = started(flow)
    again = Run(flow, record, 1_500)
    again.resume()
    assert dispatched(again) == ["a"]
    assert Timer("a", 1, 6_000) in again.actions


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("{}", "exactly one of chain, fanout, steps, states"),
        (
            "chain: [{name: a}], fanout: {branches: [{name: b}, {name: c}]}",
            "exactly one of chain, fanout, steps, states: ['chain', 'fanout']",
        ),
        ("chain: [{name: a, intent: x}, {name: a, intent: y}]", "repeated: ['a']"),
        ("chain: [{name: input, intent: x}]", "step name 'input' is reserved"),
        ("steps: [{name: a, intent: x, after: [b]}]", "after unknown step 'b'"),
        ("steps: [{name: a, after: [b]}, {name: b}]", "must come after 'b'"),
        ("steps: [{name: a, after: [b]}, {name: b, after: [a]}]", "cycle: a → b → a"),
        ("steps: [{name: a, intent: x, after: [a]}]", "cycle: a → a"),
        (
            "steps: [{name: a, intent: x}, {name: b, intent: y, after: [a]}, {name: c}]",
            "steps ['a', 'b'] lead to no later step: the workflow completes when its last"
            " step 'c' does",
        ),
        ("chain: []", "a workflow needs at least one step: 'chain' is empty"),
        ("steps: []", "a workflow needs at least one step: 'steps' is empty"),
        ("fanout: {branches: []}", "a fan-out needs at least two branches"),
        ("states: {initial: a, states: {}}", "a state machine needs states"),
        ("chain: [{name: 'a b', intent: x}]", "workflow 'w': "),
        ("chain: [{name: 'a b', intent: x}]", "`$.workflows.w.chain[0].name`"),
        ("chain: [{name: a, intent: x, on_timeout: partial}]", "needs a timeout_s"),
        ("chain: [{name: a, intent: x, timeout_s: 1, on_timeout: fallback}]", "fallback_intent"),
        ("chain: [{name: a, input: '$nope'}]", "is not a path"),
        ("fanout: {branches: [{name: a}]}", "at least two branches"),
        (
            "fanout: {branches: [{name: a}, {name: b}], join: {policy: quorum, quorum: 3}}",
            "quorum 3 is more than the 2 branches",
        ),
        ("fanout: {branches: [{name: a}, {name: b}], join: {quorum: 1}}", "'quorum: N' goes"),
        ("states: {initial: x, states: {a: {terminal: true}}}", "initial state 'x'"),
        ("states: {initial: a, states: {a: {next: [{to: b}]}}}", "unknown state 'b'"),
        ("states: {initial: a, states: {a: {next: [{to: a}]}}}", "needs a terminal state"),
        ("states: {initial: a, states: {a: {}}}", "needs 'next' transitions"),
        ("chain: [{name: a, intent: x, retries: 3}]", "unknown field `retries`"),
        ("chain: [{name: a, intent: x, timout_s: 3}]", "(did you mean 'timeout_s'?)"),
        (  # it said "(did you mean 'on_error'?)"
            "chain: [{name: a, intent: x, on_error: b}, {name: b, intent: y}]",
            "(`on_error` belongs to a state machine's state, not here)",
        ),
        (
            "states: {initial: a, states: {a: {intent: x, wait_s: -1, next: [{to: b}]},"
            " b: {terminal: true}}}",
            "at `$.workflows.w.states.states.a.wait_s`",
        ),
        (
            'chain: [{name: a, intent: x}, {name: b, intent: y, input: {o: "$.nope.outline"}}]',
            "step 'b': the input path '$.nope.outline' names no step",
        ),
        (
            'states: {initial: a, states: {a: {input: "$.plan.x", terminal: true}}}',
            "state 'a': the input path '$.plan.x' names no state",
        ),
    ],
)
def test_bad_workflows_are_refused_with_the_path(tmp_path, yaml: str, message: str) -> None:
    """A bad definition fails at load time, naming where."""
    path = tmp_path / "c.yaml"
    path.write_text(f"workflows:\n  w: {{{yaml}}}\n" if yaml != "{}" else "workflows: {w: {}}")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)
    assert "$.workflows" in str(caught.value)


def test_a_workflow_name_that_names_no_subject_is_named(tmp_path) -> None:
    """It said "at `key` in `$.workflows`", naming no workflow."""
    path = tmp_path / "c.yaml"
    path.write_text("workflows:\n  'bad name!': {chain: [{name: a, intent: x}]}\n")
    with pytest.raises(ConfigError, match="workflow name 'bad name!': use 1-128 letters"):
        load_config(path)


SAGA_AB = spec(
    "on_failure: compensate\n"
    "chain: [{name: a, intent: x, compensate: ux}, {name: b, intent: y, compensate: uy}]"
)


def test_a_cancel_waits_for_the_running_step_and_undoes_it_first() -> None:
    """Cancelled while b ran: nothing is undone until b's outcome is known; b completes
    after all, so b (the latest done) is undone first, then a, and only then does the
    instance end as cancelled and answer its starter, once."""
    record, _ = started(SAGA_AB)
    step(record, SAGA_AB, "a", output={"a": 1})
    cancel = Run(SAGA_AB, record, 3_000)
    assert cancel.cancel()
    assert dispatched(cancel) == [] and record.awaiting == ["b"]
    assert record.status == "compensating" and not any(
        isinstance(a, Finish) for a in cancel.actions
    )
    late = Run(SAGA_AB, record, 4_000)
    assert late.on_result(record.steps["b"].message_id, output={"b": 2}, error=None)
    assert dispatched(late) == ["b-undo"] and record.steps["b"].status == "completed"
    undo_b = Run(SAGA_AB, record, 4_500)
    assert undo_b.on_result(record.compensations["b"].message_id, output=None, error=None)
    assert dispatched(undo_b) == ["a-undo"] and record.status == "compensating"
    assert not any(isinstance(a, Finish) for a in undo_b.actions)
    undo_a = Run(SAGA_AB, record, 5_000)
    assert undo_a.on_result(record.compensations["a"].message_id, output=None, error=None)
    assert record.status == "cancelled" and record.ended_ms == 5_000
    assert [a for a in undo_a.actions if isinstance(a, Finish)] == [Finish()]
    assert list(record.compensations) == ["b", "a"]


def test_an_undo_that_failed_is_said_in_the_workflow_s_error() -> None:
    """b fails; a's undo fails: the starter's error and `workflow_failed` say that a's
    effect stands (they said only b's error, as after a clean rollback)."""
    record, _ = started(SAGA_AB)
    step(record, SAGA_AB, "a", output={"a": 1})
    step(record, SAGA_AB, "b", error=ErrorInfo(type="boom", message="card declined"))
    undo = Run(SAGA_AB, record, 3_000)
    stuck = ErrorInfo(type="PermanentError", message="hotel says no", retryable=False)
    assert undo.on_result(record.compensations["a"].message_id, error=stuck)
    assert record.status == "failed" and record.error is not None
    assert record.error.message == (
        "step 'b': card declined; undoing 'a' failed: their effects stand (their undo"
        " letters are open: reach dlq list --open)"
    )
    (ended,) = [a for a in undo.actions if isinstance(a, Note) and a.event == "workflow_failed"]
    assert ended.detail["undo_failed"] == ["a"]


def test_a_running_step_that_fails_after_a_cancel_is_not_undone() -> None:
    """Cancelled while b ran, b's task fails (or its retry is refused): only a is undone."""
    record, _ = started(SAGA_AB)
    step(record, SAGA_AB, "a", output={"a": 1})
    assert Run(SAGA_AB, record, 3_000).cancel()
    refused = ErrorInfo(type="cancelled", message="not dispatched", retryable=False)
    told = Run(SAGA_AB, record, 3_200)
    assert told.on_result(record.steps["b"].message_id, error=refused)
    assert dispatched(told) == ["a-undo"] and record.awaiting == []


def test_a_running_step_silent_past_its_deadline_is_undone_last_when_it_completes() -> None:
    """Cancelled while b ran and b is silent: at b's deadline (the starting task's execute
    budget, plus a grace) a is undone and the instance ends; b completing later still is
    undone then, without a second end."""
    record, _ = started(SAGA_AB)
    step(record, SAGA_AB, "a", output={"a": 1})
    cancel = Run(SAGA_AB, record, 3_000)
    assert cancel.cancel()
    due = record.steps["b"].deadline_ms
    assert due == 2_000 + record.task.budget.execute_ms + LATE_GRACE_MS
    assert Timer("b" + LATE, 1, due) in cancel.actions
    gave_up = Run(SAGA_AB, record, due)
    assert gave_up.on_timer("b" + LATE, 1)
    assert dispatched(gave_up) == ["a-undo"]
    Run(SAGA_AB, record, due + 100).on_result(record.compensations["a"].message_id, error=None)
    assert record.status == "cancelled" and record.ended_ms == due + 100
    late = Run(SAGA_AB, record, due + 200)
    assert late.on_result(record.steps["b"].message_id, output={"b": 2}, error=None)
    assert dispatched(late) == ["b-undo"]
    undo_b = Run(SAGA_AB, record, due + 300)
    assert undo_b.on_result(record.compensations["b"].message_id, output=None, error=None)
    assert record.status == "cancelled" and record.ended_ms == due + 100
    assert not any(isinstance(a, Finish) for a in undo_b.actions)


def test_after_a_crash_the_wait_for_a_stopped_step_is_armed_again() -> None:
    """resume lists the same timer for the wait as the cancel did (it is deduplicated)."""
    record, _ = started(SAGA_AB)
    step(record, SAGA_AB, "a", output={"a": 1})
    cancel = Run(SAGA_AB, record, 3_000)
    cancel.cancel()
    again = Run(SAGA_AB, record, 9_000)
    again.resume()
    timers = [a for a in again.actions if isinstance(a, Timer) and a.key.endswith(LATE)]
    assert timers == [a for a in cancel.actions if isinstance(a, Timer)]
    assert timers == [Timer("b" + LATE, 1, record.steps["b"].deadline_ms)]


def test_a_fan_out_without_a_join_step_completes_once() -> None:
    """The implicit pass-through join finishes the workflow exactly once."""
    flow = spec("fanout: {branches: [{name: a, intent: x}, {name: b, intent: y}]}")
    record, _ = started(flow)
    step(record, flow, "a", 1)
    last = step(record, flow, "b", 2)
    assert sum(isinstance(a, Finish) for a in last.actions) == 1
    assert record.result == {"results": {"a": 1, "b": 2}, "missing": {}}


def test_steps_inherit_the_starting_priority_unless_they_set_their_own() -> None:
    """A P0 workflow's steps are P0, but a step may say otherwise."""
    flow = spec("chain: [{name: a, intent: x}, {name: b, intent: y, priority: P2}]")
    task = Task(v=1, message_id="wf2", trace_id="t", topic="flow", priority="P0")
    record = new_record("flow", task, flow, now_ms=0)
    Run(flow, record, 0).start()
    assert record.steps["a"].priority == "P0"
    step(record, flow, "a", 1)
    assert record.steps["b"].priority == "P2"


def test_a_step_waits_for_all_it_is_after() -> None:
    """steps with `after`: a diamond a → (b, c) → d; d starts only when b and c are done."""
    flow = spec(
        "steps: [{name: a, intent: x}, {name: b, intent: y, after: [a]},"
        " {name: c, intent: z, after: [a]}, {name: d, intent: w, after: [b, c]}]"
    )
    record, run = started(flow, "in")
    assert dispatched(run) == ["a"]
    assert sorted(dispatched(step(record, flow, "a", "A"))) == ["b", "c"]
    assert dispatched(step(record, flow, "b", "B")) == []  # c is not done yet
    assert dispatched(step(record, flow, "c", "C")) == ["d"]
    assert record.steps["d"].input == {"results": {"b": "B", "c": "C"}, "missing": {}}


def test_a_state_that_times_out_goes_to_its_on_timeout_state() -> None:
    """A state's timer moves the machine to on_timeout; without one the workflow fails."""
    flow = spec(
        "states: {initial: wait, states: {wait: {intent: x, timeout_s: 2, on_timeout: gave_up,"
        " next: [{to: done}]}, gave_up: {terminal: true}, done: {terminal: true}}}"
    )
    record, run = started(flow)
    assert Timer("wait", 1, 3_000) in run.actions
    assert not Run(flow, record, 2_000).on_timer("wait", 2)  # not this visit's timer
    late = Run(flow, record, 3_000)
    assert late.on_timer("wait", 1)
    assert record.status == "completed" and record.path == ["wait", "gave_up"]
    assert record.steps["wait"].status == "timed_out"
    strict = spec(
        "states: {initial: wait, states: {wait: {intent: x, timeout_s: 2, next: [{to: done}]},"
        " done: {terminal: true}}}"
    )
    record, _ = started(strict)
    Run(strict, record, 3_000).on_timer("wait", 1)
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "timeout"
    assert "state 'wait' did not finish within 2 s" in record.error.message  # not "step"


@pytest.mark.parametrize("instance", ["wf1", "x" * 120])
def test_a_step_task_is_named_back_from_its_message_id(instance: str) -> None:
    """A dead letter names the step its task is a visit of, short ids and hashed long ones
    alike (a step's name may hold dashes); a compensating task's letter is not handled."""
    task = Task(v=1, message_id=message_id_of(instance, "fetch-web", 3), trace_id="t", topic="x")
    step_of = workflow_step_of(instance, task)
    assert step_of == WorkflowStep(instance_id=instance, step="fetch-web", handled=True)
    undo = msgspec.structs.replace(task, message_id=message_id_of(instance, "fetch-web", "undo"))
    assert workflow_step_of(instance, undo) == WorkflowStep(
        instance_id=instance, step="fetch-web", compensation=True, handled=False
    )
    assert workflow_step_of("other", task) is None and workflow_step_of(None, task) is None


def test_an_event_taken_while_its_state_runs_gives_the_next_state_that_state_s_input() -> None:
    """A `cancel` signal while `pending` still charges: the charge is abandoned (cancelled)
    and `refunded` gets what `pending` was given, not a result that never came (null)."""
    flow = spec(
        """
        states:
          initial: pending
          states:
            pending:
              intent: charge
              next: [{event: cancel, to: refunded}, {when: {field: paid, value: true}, to: done}]
            refunded: {intent: refund, terminal: true}
            done: {terminal: true}
        """
    )
    record, _ = started(flow, {"order": 7})
    run = Run(flow, record, 2_000)
    assert run.on_signal("cancel")
    assert record.steps["pending"].status == "cancelled"
    assert record.current == "refunded" and record.steps["refunded"].input == {"order": 7}
    assert dispatched(run) == ["refunded"]


def test_a_state_without_an_intent_refuses_a_timeout_it_would_not_keep() -> None:
    """A state that only waits for an event has no run for `timeout_s` to bound: the
    definition is refused, naming what bounds the wait instead."""
    with pytest.raises(
        msgspec.ValidationError,
        match=r"'timeout_s' bounds the state's intent.*'wait_s' bounds its wait",
    ):
        spec(
            "states: {initial: wait, states: {wait: {timeout_s: 3, on_timeout: done,"
            " next: [{event: go, to: done}]}, done: {terminal: true}}}"
        )


APPROVAL = spec(
    """
    states:
      initial: review
      states:
        review:
          intent: check
          wait_s: 10
          on_timeout: escalated
          next: [{when: {field: clear, value: true}, to: approved}, {event: approve, to: approved}]
        approved: {terminal: true}
        escalated: {intent: ask_manager, terminal: true}
    """
)


def test_a_state_waits_for_its_events_no_longer_than_its_wait_s() -> None:
    """`review`'s result matches no `when`: it waits for `approve` 10 s from then, and past
    that goes to its on_timeout state, which gets `{"timed_out": "review"}`."""
    record, run = started(APPROVAL)
    assert not [a for a in run.actions if isinstance(a, Timer) and a.key != DEADLINE]
    waits = step(record, APPROVAL, "review", {"clear": False}, now=5_000)
    assert Timer("review.wait", 1, 15_000) in waits.actions
    assert record.status == "running" and record.current == "review"
    late = Run(APPROVAL, record, 15_000)
    assert late.on_timer("review.wait", 1)
    assert record.path == ["review", "escalated"]
    assert record.steps["escalated"].input == {"timed_out": "review"}
    assert dispatched(late) == ["escalated"]


def test_an_event_in_time_leaves_the_wait_timer_nothing_to_do() -> None:
    """`approve` before the 10 s: the machine moves on, and the timer, when it comes, is
    not this state's wait any more (nor is an older visit's)."""
    record, _ = started(APPROVAL)
    step(record, APPROVAL, "review", {"clear": False}, now=5_000)
    assert Run(APPROVAL, record, 6_000).on_signal("approve")
    assert record.status == "completed"
    assert not Run(APPROVAL, record, 15_000).on_timer("review.wait", 1)
    assert record.path == ["review", "approved"]


def test_a_wait_without_on_timeout_fails_naming_the_events_it_waited_for() -> None:
    """An intent-less state that waits 2 s for `go` or `stop`, nothing to go to past it: the
    workflow fails with a timeout that says which state waited for what."""
    flow = spec(
        "states: {initial: hold, states: {hold: {wait_s: 2, next: [{event: go, to: done},"
        " {event: stop, to: done}]}, done: {terminal: true}}}"
    )
    record, run = started(flow)
    assert Timer("hold.wait", 1, 3_000) in run.actions
    assert not Run(flow, record, 3_000).on_timer("hold.wait", 2)  # not this visit's
    assert Run(flow, record, 3_000).on_timer("hold.wait", 1)
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "timeout"
    assert record.error.message == "state 'hold' waited 2 s for go or stop: none came"


def test_a_resumed_instance_arms_its_wait_again() -> None:
    """After a crash, a state that waits is given its timer again, due when it was."""
    record, _ = started(APPROVAL)
    step(record, APPROVAL, "review", {"clear": False}, now=5_000)
    again = Run(APPROVAL, record, 9_000)
    again.resume()
    assert Timer("review.wait", 1, 15_000) in again.actions
    assert dispatched(again) == []


def test_wait_s_needs_an_event_to_wait_for() -> None:
    """A wait_s on a state no event moves is refused; on_timeout may go with wait_s alone."""
    with pytest.raises(msgspec.ValidationError, match="'wait_s' bounds the wait for an event"):
        spec(
            "states: {initial: s, states: {s: {intent: x, wait_s: 3, next: [{to: done}]},"
            " done: {terminal: true}}}"
        )
    with pytest.raises(msgspec.ValidationError, match="'on_timeout' needs a timeout_s or a"):
        spec(
            "states: {initial: s, states: {s: {intent: x, on_timeout: done,"
            " next: [{event: go, to: done}]}, done: {terminal: true}}}"
        )


def test_a_signal_counts_when_it_was_stored_not_when_it_is_handled() -> None:
    """`approve` stored before the wait's end is taken though handled after it (the
    coordinator was away); one stored after it is not (the wait's timer moves on)."""
    late_record, _ = started(APPROVAL)
    step(late_record, APPROVAL, "review", {"clear": False}, now=5_000)
    assert not Run(APPROVAL, late_record, 16_000).on_signal("approve", at_ms=15_001)
    assert late_record.current == "review"
    record, _ = started(APPROVAL)
    step(record, APPROVAL, "review", {"clear": False}, now=5_000)
    assert Run(APPROVAL, record, 16_000).on_signal("approve", at_ms=14_999)
    assert record.path == ["review", "approved"]


def test_show_says_a_state_without_an_intent_waits_not_that_it_completed() -> None:
    """`reach workflows show` of an instance in a state that only waits for an event: it
    read `completed … (pass-through)`; it is `waiting`, for an event."""
    flow = spec(
        "states: {initial: hold, states: {hold: {wait_s: 2, next: [{event: go, to: done}]},"
        " done: {terminal: true}}}"
    )
    record, _ = started(flow)
    [line] = [x for x in tree(record).splitlines() if " hold " in x]
    assert " waiting " in line and "(waits for an event)" in line and "completed" not in line


def test_a_branch_whose_input_names_nothing_fails_the_fanout_before_any_sibling_is_sent() -> None:
    """The middle branch's path names nothing: the workflow fails at once, and neither the
    branch listed before it nor the one after is dispatched (nor waited for by the undoing)."""
    definition = spec(
        "on_failure: compensate\n"
        "fanout: {branches: [{name: a, intent: x, compensate: undo_x},"
        ' {name: b, intent: y, input: "$.input.nowhere.z"}, {name: c, intent: z}],'
        " then: {name: merge, intent: m}}"
    )
    record, run = started(definition, {"q": 1})
    assert record.status == "failed" and record.error is not None
    assert record.error.type == "input_missing"
    assert dispatched(run) == []
    assert record.steps["a"].status == "cancelled" and "c" not in record.steps
    assert record.awaiting == [] and record.compensations == {}
    assert any(isinstance(a, Finish) for a in run.actions)


def test_show_says_how_long_a_state_waited_once_a_signal_moved_the_machine_on() -> None:
    """Left by an event 9 s after it was entered, a state without an intent read
    `completed 0 ms (pass-through)`; it waited 9,000 ms, for an event."""
    flow = spec(
        "states: {initial: hold, states: {hold: {next: [{event: go, to: done}]},"
        " done: {terminal: true}}}"
    )
    record, _ = started(flow)
    assert Run(flow, record, record.started_ms + 9_000).on_signal("go", at_ms=0)
    [line] = [x for x in tree(record).splitlines() if "─ hold " in x]
    assert " 9000 ms  (waited for an event)" in line, line
