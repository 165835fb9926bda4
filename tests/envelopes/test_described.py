"""The one line `reach trace` and the dashboard's timeline give an event."""

from __future__ import annotations

import msgspec

from agentreach.envelopes import Event
from agentreach.envelopes.described import described


def _event(name: str, **detail: object) -> Event:
    return Event(v=1, event=name, message_id="m-1", trace_id="m-1", topic="t", detail=detail)


def test_a_scheduled_retry_says_when_and_after_what_in_full():
    """The reason the next attempt comes was cut at 80 columns of JSON (a walkthrough could
    not read "a3 went OFFLINE while running it" without the nats CLI)."""
    error = {"type": "reassigned", "message": "a3 went OFFLINE while running it"}
    moved = _event("retry_scheduled", next_attempt=2, delay_ms=0, error=error)
    failed = {"type": "ConnectionError", "message": "upstream down", "retryable": True}
    later = _event("retry_scheduled", next_attempt=3, delay_ms=2003, error=failed)
    said = described(moved)
    assert said == "attempt 2 at once, after reassigned: a3 went OFFLINE while running it"
    assert described(later) == "attempt 3 in 2003 ms, after ConnectionError: upstream down"


def test_agents_passed_over_for_one_reason_are_said_once():
    """Every STOPPED agent of a fleet was listed with its reason: a screen-wide line."""
    stopped = {f"old-{n}": "agent stopped" for n in range(7)}
    passed = {**stopped, "b-1": "circuit open for 'x' (3 failures)"}
    routed = _event("routed", rule="default", candidates=["a-1", "a-2"], passed_over=passed)
    routed = Event(**{**msgspec.structs.asdict(routed), "agent_id": "a-1"})
    assert described(routed) == (
        "rule default: → a-1 (candidates: a-1, a-2); passed over old-0, old-1, old-2 +4:"
        " agent stopped; b-1: circuit open for 'x' (3 failures)"
    )
