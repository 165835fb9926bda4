"""How the ttl of a dispatch is said to have run out, as both SDKs word it."""

from __future__ import annotations

from agentreach.envelopes import ttl_passed_in_queue


def test_a_dispatch_that_only_waited_passed_in_the_queue():
    said = ttl_passed_in_queue(500, "a2", dispatched_ms=10_000, received_ms=9_900)
    assert said == "ttl 500 ms passed in the queue of a2"


def test_a_dispatch_delivered_before_did_not_only_wait():
    """A task that crashed its agent three times read "passed in the queue" (a walkthrough)."""
    said = ttl_passed_in_queue(29_999, "a2", dispatched_ms=10_000, received_ms=9_900, delivered=3)
    assert said == (
        "ttl 29999 ms ran out with a2: delivered 3 times, and no run of it finished (each"
        " process that took it died or stalled)"
    )
