"""What the fold remembers of messages: ends counted once, routings that vouch for reports."""

from __future__ import annotations

import msgspec

from agentreach.broker.lifecycle import event_for
from agentreach.broker.names import COORDINATOR, Names
from agentreach.coordinator.observability.once import Routes
from agentreach.envelopes import Task

NAMES = Names()


def subject(kind: str, task: Task, sender: str) -> str:
    return NAMES.event(kind, task.topic, task.trace_id, task.message_id, sender)


def test_a_report_counts_only_from_an_agent_its_attempt_was_routed_to():
    routes = Routes(NAMES, limit=2)
    task = Task(v=1, message_id="m-1", trace_id="m-1", topic="t")
    by = {a: event_for(task, "completed", agent_id=a, duration_ms=1) for a in ("a", "b", "x")}
    assert routes.vouch(subject("completed", task, "x"), by["x"])  # no routing seen: counted
    for agent in ("a", "b"):  # routed again, to another agent (the first refused it)
        routed = event_for(task, "routed", agent_id=agent)
        assert routes.vouch(subject("routed", task, COORDINATOR), routed)
    assert not routes.vouch(subject("completed", task, "x"), by["x"])
    assert routes.vouch(subject("completed", task, "b"), by["b"])  # the end: forgotten
    assert routes.vouch(subject("completed", task, "x"), by["x"])  # a second end (not counted)
    for n in range(3):  # the oldest routing is forgotten first
        other = Task(v=1, message_id=f"o-{n}", trace_id=f"o-{n}", topic="t")
        routing = event_for(other, "routed", agent_id="a")
        routes.vouch(subject("routed", other, COORDINATOR), routing)
    first = Task(v=1, message_id="o-0", trace_id="o-0", topic="t")
    forged = event_for(first, "failed", agent_id="x")
    assert routes.vouch(subject("failed", first, "x"), forged)
    last = Task(v=1, message_id="o-2", trace_id="o-2", topic="t")
    assert not routes.vouch(subject("failed", last, "x"), event_for(last, "failed", agent_id="x"))


def test_a_body_its_subject_does_not_vouch_for_is_not_counted():
    routes = Routes(NAMES)
    task = Task(v=1, message_id="m-2", trace_id="m-2", topic="t")
    ending = event_for(task, "dead_lettered", agent_id="x", reason="poison")
    assert not routes.vouch(subject("failed", task, "x"), ending)
    assert routes.vouch(subject("dead_lettered", task, COORDINATOR), ending)


def test_a_report_whose_body_names_another_message_than_its_subject_is_not_counted():
    """The routings of a report not seen are read by its subject's ids: a body naming
    another message would be counted on the strength of the subject's routing."""
    routes = Routes(NAMES)
    named, other = (Task(v=1, message_id=m, trace_id=m, topic="t") for m in ("m-3", "m-4"))
    report = event_for(other, "completed", agent_id="x", duration_ms=1)
    assert not routes.vouch(subject("completed", named, "x"), report)
    assert routes.vouch(subject("completed", other, "x"), report)


def test_a_report_counted_carries_its_routings_intake_time_and_priority():
    """An agent's own `received_ms` and `priority` made its latency and labels up."""
    routes = Routes(NAMES)
    task = Task(v=1, message_id="m-5", trace_id="m-5", topic="t", received_ms=5_000)
    assert routes.vouch(
        subject("routed", task, COORDINATOR), event_for(task, "routed", agent_id="x")
    )
    told = msgspec.structs.replace(task, received_ms=1, priority="P0")
    counted = routes.vouched(
        subject("completed", task, "x"), event_for(told, "completed", agent_id="x")
    )
    assert counted is not None and (counted.received_ms, counted.priority) == (5_000, "P1")
