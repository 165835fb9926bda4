"""Which priorities a sender may use: parsing, the bucket's key scheme, the judgement at
intake, and what the auth directory records for each role (no server)."""

from __future__ import annotations

import json

import msgspec
import pytest

from agentreach.auth import AuthDirectory, AuthError
from agentreach.coordinator.routing.allowances import (
    Allowance,
    SenderPriorities,
    parse_priorities,
    priorities_key,
    sender_of_key,
)
from agentreach.coordinator.routing.priorities import PriorityAllowances
from agentreach.envelopes import Task


def _task(caller: str | None, priority: str = "P0") -> Task:
    return Task(
        v=1, message_id="m-1", trace_id="m-1", topic="summarize", caller=caller, priority=priority
    )  # type: ignore[arg-type]


def _record(sender: str, *priorities: str) -> bytes:
    return msgspec.json.encode(SenderPriorities(sender=sender, priorities=priorities))  # type: ignore[arg-type]


def test_priorities_parse_in_any_case_and_order_into_urgency_order():
    """Duplicates and spaces go, case does not matter, the order is P0, P1, P2."""
    assert parse_priorities(" p2, P0 ,p2") == ("P0", "P2")
    assert parse_priorities("P1") == ("P1",)


@pytest.mark.parametrize(
    ("text", "said"),
    [("P3", "priority 'P3'"), ("", "at least one"), (" , ", "at least one"), ("high", "'HIGH'")],
)
def test_a_wrong_priority_list_names_what_is_wrong(text, said):
    """An unknown priority is named; an empty list is refused (revoke stops a party)."""
    with pytest.raises(ValueError, match=said):
        parse_priorities(text)


def test_a_priorities_key_never_reads_as_an_agent_id():
    """Names are one subject token (no dot): ``priorities.<name>`` is no agent's key."""
    assert priorities_key("alice") == "priorities.alice"
    assert sender_of_key("priorities.alice") == "alice"
    assert sender_of_key("alice") is None and sender_of_key("priorities-1") is None
    with pytest.raises(msgspec.ValidationError):  # the two records do not pass for each other
        msgspec.json.decode(_record("alice", "P1"), type=Allowance)


def test_nothing_is_refused_unless_enforced():
    """Without the seal key (an open server) every priority goes, listed or not."""
    gate = PriorityAllowances()
    gate.apply("bulk", _record("bulk", "P2"))
    assert gate.refusal(_task("bulk", "P0")) is None
    assert gate.refusal(_task("stranger", "P0")) is None


def test_a_task_above_its_senders_priorities_is_refused_naming_the_fix():
    """Enforced: a pushed sender is judged by its record, an unlisted one by P1 and P2,
    and the operators' bare form (no sender) not at all."""
    gate = PriorityAllowances()
    gate.enforced = True
    gate.apply("pager", _record("pager", "P0", "P1", "P2"))
    gate.apply("bulk", _record("bulk", "P2"))
    assert gate.refusal(_task("pager", "P0")) is None
    assert gate.refusal(_task(None, "P0")) is None
    assert gate.refusal(_task("stranger", "P1")) is None
    error = gate.refusal(_task("stranger", "P0"))
    assert error is not None and error.type == "priority_not_allowed" and not error.retryable
    assert error.message == (
        "caller 'stranger' may not send P0 tasks (it may use P1,P2): send it as P1, or ask an"
        " operator to run `reach auth allow stranger --priorities P0,P1,P2` and `reach auth push`"
        " (the push alone, when `reach auth list` shows it allowed already)"
    )
    bulk = gate.refusal(_task("bulk", "P1"))
    assert bulk is not None and "--priorities P1,P2`" in bulk.message


def test_a_deleted_unreadable_or_misnamed_record_falls_back_to_the_unlisted_priorities():
    """A revoked sender's key is deleted; a record naming another sender is not believed."""
    gate = PriorityAllowances()
    gate.apply("bulk", _record("bulk", "P0"))
    assert gate.of("bulk") == ("P0",)
    for value in (None, b"{not json", _record("someone-else", "P0")):
        gate.apply("bulk", _record("bulk", "P0"))
        gate.apply("bulk", value)
        assert gate.of("bulk") == ("P1", "P2")


@pytest.fixture
def directory(tmp_path) -> AuthDirectory:
    made = AuthDirectory(tmp_path / "auth")
    made.init()
    return made


def test_new_callers_get_p1_p2_other_senders_every_priority(directory):
    """A new caller may not use P0 until given it; agents, workers and operators may."""
    directory.issue("caller", "bulk")
    directory.issue("caller", "pager", priorities=("P0", "P1"))
    directory.issue("agent", "summarizer-1", intents=("summarize",))
    directory.issue("worker", "fixer")
    assert directory.priorities_of("bulk") == ("P1", "P2")
    assert directory.priorities_of("pager") == ("P0", "P1")
    assert directory.sender_priorities() == {
        "admin": ("P0", "P1", "P2"),
        "bulk": ("P1", "P2"),
        "pager": ("P0", "P1"),
        "summarizer-1": ("P0", "P1", "P2"),
        "fixer": ("P0", "P1", "P2"),
    }


def test_issuing_again_keeps_allow_replaces_revoking_removes(directory):
    """New creds keep the priorities, `allow` replaces them, a revoked party's go."""
    directory.issue("caller", "bulk", priorities=("P0",))
    directory.issue("caller", "bulk")
    assert directory.priorities_of("bulk") == ("P0",)
    directory.allow("bulk", priorities=("P2",))
    assert directory.priorities_of("bulk") == ("P2",)
    directory.revoke("bulk")
    assert directory.sender_priorities()["bulk"] is None


def test_a_caller_issued_before_priorities_keeps_every_one_until_narrowed(directory):
    """A registry entry without the field (an earlier version's) is pushed as all three."""
    directory.issue("caller", "old-timer")
    path = directory.root / "registry.json"
    registry = json.loads(path.read_text())
    del registry["users"]["old-timer"]["priorities"]
    path.write_text(json.dumps(registry))
    assert directory.priorities_of("old-timer") == ("P0", "P1", "P2")
    directory.issue("caller", "old-timer")  # new creds: still what it had
    assert directory.priorities_of("old-timer") == ("P0", "P1", "P2")
    directory.allow("old-timer", priorities=("P1",))
    assert directory.priorities_of("old-timer") == ("P1",)


def test_the_coordinator_has_no_priorities_to_give(directory):
    """The coordinator sends on the bare form only: no record is made or allowed for it."""
    with pytest.raises(AuthError, match="sends no tasks of its own"):
        directory.allow("coordinator", priorities=("P0",))
    assert "coordinator" not in directory.sender_priorities()
