"""The one line `reach trace` and the dashboard's timeline give an event."""

from __future__ import annotations

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
