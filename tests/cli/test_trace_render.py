"""How `reach trace` lays out what it read (pure: the events are given)."""

from __future__ import annotations

import datetime as dt

from agentreach.cli.trace import Step, render
from agentreach.envelopes import Event

T0 = dt.datetime(2026, 12, 6, 19, 0, tzinfo=dt.UTC)


def step(seq: int, event: str, caller: str | None, agent_id: str | None = "slow-1") -> Step:
    about = Event(
        v=1, event=event, message_id="E-2", trace_id="E-2", topic="slow", agent_id=agent_id,
        caller=caller,
    )  # fmt: skip
    return Step(at=T0 + dt.timedelta(seconds=seq), seq=seq, event=about)


def test_one_id_sent_by_two_callers_is_two_messages_each_with_its_caller() -> None:
    """Sent bare, then under the same id by `billing` past the duplicate window: both ran,
    and the trace showed one message with two runs of attempt 1 (an outside trial)."""
    steps = [
        step(1, "routed", None, None), step(2, "accepted", None), step(3, "completed", None),
        step(301, "routed", "billing", None), step(302, "accepted", "billing"),
        step(303, "completed", "billing"),
    ]  # fmt: skip
    lines = render("E-2", steps).splitlines()
    assert lines[0] == "trace E-2 · 2 message(s)"
    headers = [line for line in lines if line.startswith("message ")]
    assert headers == [
        "message E-2  topic slow  caller (none: the bare subject)",
        "message E-2  topic slow  caller billing",
    ]
    assert [line.split()[2] for line in lines[2:5]] == ["routed", "accepted", "completed"]


def test_a_message_of_one_caller_names_none() -> None:
    lines = render("E-2", [step(1, "routed", "billing", None)]).splitlines()
    assert lines[:2] == ["trace E-2 · 1 message(s)", "message E-2  topic slow"]


def test_an_earlier_attempt_s_event_after_the_end_is_said_to_be_late() -> None:
    """A stopped agent's run was reassigned and completed by another; resumed, the first
    failed at its deadline, and the trace ended on `failed` as if the task had (a trial)."""

    def of(seq: int, event: str, attempt: int, agent_id: str) -> Step:
        about = Event(
            v=1, event=event, message_id="E-3", trace_id="E-3", topic="slow",
            agent_id=agent_id, attempt=attempt,
        )  # fmt: skip
        return Step(at=T0 + dt.timedelta(seconds=seq), seq=seq, event=about)

    steps = [
        of(1, "accepted", 1, "stq-000"), of(40, "accepted", 2, "prt-000"),
        of(41, "completed", 2, "prt-000"), of(60, "failed", 1, "stq-000"),
    ]  # fmt: skip
    lines = render("E-3", steps).splitlines()
    assert lines[-1].endswith("(late: a run's report after the message ended)")
    assert "failed" in lines[-1] and not any("late:" in line for line in lines[:-1])


def test_the_ending_attempt_s_own_report_after_a_dead_letter_is_late_too() -> None:
    """Expired while its agent was stopped, the run resumed and reported `failed` #1 after
    `dead_lettered` #1: it was not marked (a re-trial). A worker's `replayed` is no run's."""

    def of(seq: int, event: str, agent_id: str | None) -> Step:
        about = Event(v=1, event=event, message_id="E-4", trace_id="E-4", topic="slow",
                      agent_id=agent_id)  # fmt: skip
        return Step(at=T0 + dt.timedelta(seconds=seq), seq=seq, event=about)

    steps = [
        of(1, "accepted", "a-1"), of(12, "dead_lettered", None), of(23, "failed", "a-1"),
        of(30, "replayed", None),
    ]  # fmt: skip
    lines = render("E-4", steps).splitlines()
    assert [("(late:" in line) for line in lines[2:]] == [False, False, True, False]
