"""Whose run of a message each event is, when two callers used one message id (pure)."""

from __future__ import annotations

import msgspec

from agentreach.broker.lifecycle import event_for
from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.runs import NOBODY, owners, runs_of
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import Event, Task, encode

NAMES = Names()
ALICE = Task(v=1, message_id="order-21", trace_id="order-21", topic="pay", caller="alice")
MALLORY = msgspec.structs.replace(ALICE, caller="mallory", topic="mtopic")


def _stored(trace: list[tuple[Event, str]]) -> list[tuple[StoredMessage, Event]]:
    found = []
    for seq, (event, sender) in enumerate(trace, 1):
        subject = NAMES.event(event.event, event.topic, event.trace_id, event.message_id, sender)
        found.append((StoredMessage(seq, subject, encode(event), {}, seq), event))
    return found


def test_an_agent_s_report_is_of_the_caller_its_attempt_was_routed_for() -> None:
    """mallory's own task under alice's id, routed to herself after alice's was routed to
    bob: her `completed` was read as alice's result, and bob's as hers."""
    trace = _stored(
        [
            (event_for(ALICE, "routed", agent_id="bob"), COORDINATOR),
            (event_for(MALLORY, "routed", agent_id="mallory"), COORDINATOR),
            (event_for(MALLORY, "completed", agent_id="mallory", result="FORGED"), "mallory"),
            (event_for(ALICE, "completed", agent_id="bob", result="paid"), "bob"),
        ]
    )
    for caller, agent in (("alice", "bob"), ("mallory", "mallory")):
        own, others = runs_of(caller, trace, NAMES)
        assert [(e.event, e.agent_id) for e in own] == [("routed", agent), ("completed", agent)]
        assert others


def test_an_agent_given_both_runs_is_told_apart_by_the_caller_it_names() -> None:
    routed = [(event_for(t, "routed", agent_id="bob"), COORDINATOR) for t in (ALICE, MALLORY)]
    nameless = msgspec.structs.replace(event_for(ALICE, "accepted", agent_id="bob"), caller=None)
    completed = event_for(ALICE, "completed", agent_id="bob")
    trace = _stored([*routed, (completed, "bob"), (nameless, "bob")])
    own, _ = runs_of("alice", trace, NAMES)
    assert [e.event for e in own] == ["routed", "completed"]
    theirs, _ = runs_of("mallory", trace, NAMES)  # the nameless one: nobody's
    assert [e.event for e in theirs] == ["routed"]


def test_a_run_of_no_caller_is_no_caller_s() -> None:
    """A workflow's step (or an operator's bare task) has no caller: its events went to the
    latest caller who sent a task under its id, bob's result with them."""
    step = msgspec.structs.replace(ALICE, caller=None)
    trace = _stored(
        [
            (event_for(MALLORY, "routed", agent_id="mallory"), COORDINATOR),
            (event_for(step, "routed", agent_id="bob"), COORDINATOR),
            (event_for(step, "completed", agent_id="bob", result="card"), "bob"),
        ]
    )
    theirs, others = runs_of("mallory", trace, NAMES)
    assert [(e.event, e.agent_id) for e in theirs] == [("routed", "mallory")] and others


def test_an_event_naming_no_caller_is_not_the_caller_less_run_s_when_it_had_several() -> None:
    """An agent of revision 34 names no caller: given one id's attempt for an operator's
    bare task and for mallory's, its events were the operator's run's, and mallory's
    completion resolved the operator's letter as ended twice."""
    bare = msgspec.structs.replace(ALICE, caller=None)
    routed = [(event_for(t, "routed", agent_id="bob"), COORDINATOR) for t in (bare, MALLORY)]
    nameless = msgspec.structs.replace(event_for(MALLORY, "completed", agent_id="bob"), caller=None)
    trace = _stored([*routed, (nameless, "bob")])
    assert owners(trace, NAMES) == [None, "mallory", NOBODY]
