"""What the metrics fold counts, and as what: rejections by kind, agents' transitions."""

from __future__ import annotations

from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from agentreach import envelopes
from agentreach.coordinator.observability import priming
from agentreach.coordinator.observability.flow import FlowMetrics
from agentreach.coordinator.observability.labels import rejection_kind
from agentreach.envelopes import Event, now_ms
from tests.support import scraped


def _letter(kind: str, **error: Any) -> Event:
    detail = {"reason": "rejected", "error": {"type": kind, "message": "m", **error}}
    return Event(v=1, event="dead_lettered", message_id="m", trace_id="m", topic="t", detail=detail)


def test_a_circuit_open_letter_counts_though_it_says_when_to_try_again() -> None:
    """Every circuit_open letter carries retry_after_ms (0 too): taken for a quota refusal's
    letter, none was counted (21 letters, the counter at 0, in a walkthrough)."""
    assert rejection_kind(_letter("circuit_open", retry_after_ms=0)) == "circuit_open"
    assert rejection_kind(_letter("circuit_open", retry_after_ms=9_000)) == "circuit_open"
    assert rejection_kind(_letter("backpressure")) == "backpressure"


def test_a_quota_refusal_s_letter_is_not_counted_again() -> None:
    """Its `rejected` event counted it already."""
    assert rejection_kind(_letter("rate_limited", retry_after_ms=500)) is None
    assert rejection_kind(_letter("rate_limited")) == "rate_limited"


def test_a_signal_or_cancel_refused_for_its_caller_s_quota_counts_as_a_quota_refusal() -> None:
    """Charged to the caller's quota as tasks are: a flood of them over it shows where a
    flood of tasks would. Their other answers count as nothing."""
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True)

    def said(kind: str, **detail: Any) -> Event:
        return Event(v=1, event=kind, message_id="i", trace_id="i", topic="approval", detail=detail)

    over = {"type": "rate_limited", "message": "m", "retry_after_ms": 500}
    outgrown = {"type": "record_too_large", "message": "m"}
    for event in (
        said("signal_ignored", signal="go", by="alice", error=over),
        said("cancel_refused", by="alice", error=over),
        said("signal_ignored", signal="go", waits_for=["approve"]),
        said("signal_ignored", signal="go", ended="failed", error=outgrown),
    ):
        flow.fold(event, now_ms())
    counted = scraped(registry)
    assert counted("reach_rejections_total", {"kind": "quota", "topic": "approval"}) == 2
    assert rejection_kind(said("signal_ignored", signal="go", error=outgrown)) is None


def test_a_new_reason_for_the_same_state_is_no_transition() -> None:
    """An `unresponsive` verdict about an agent SUSPECT already (SUSPECT → SUSPECT) counted
    in reach_agent_transitions_total{state="SUSPECT"}, as if it had flapped."""
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True)

    def agent_state(state: str, was: str) -> Event:
        detail = {"state": state, "was": was, "reason": "r"}
        return Event(
            v=1, event="agent_state", message_id="m", trace_id="m", topic="-", detail=detail
        )

    for state, was in (("SUSPECT", "ONLINE"), ("SUSPECT", "SUSPECT"), ("OFFLINE", "SUSPECT")):
        flow.fold(agent_state(state, was), now_ms())
    counted = scraped(registry)
    assert counted("reach_agent_transitions_total", {"state": "SUSPECT"}) == 1
    assert counted("reach_agent_transitions_total", {"state": "OFFLINE"}) == 1


def test_a_clean_stop_is_counted_as_stopped_not_offline() -> None:
    """A graceful stop's transition (OFFLINE, reason `stopped`) counted as OFFLINE, and a
    rolling deploy read as flapping; it is STOPPED, a series there at 0 from the start."""
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True)
    counted = registry.get_sample_value
    assert counted("reach_agent_transitions_total", {"state": "STOPPED"}) == 0
    for reason in ("stopped", "stopped", "no heartbeat for 30 s"):
        detail = {"state": "OFFLINE", "was": "ONLINE", "reason": reason}
        event = Event(
            v=1, event="agent_state", message_id="m", trace_id="m", topic="-", detail=detail
        )
        flow.fold(event, now_ms())
    assert counted("reach_agent_transitions_total", {"state": "STOPPED"}) == 2
    assert counted("reach_agent_transitions_total", {"state": "OFFLINE"}) == 1


def test_a_new_series_shows_at_0_before_what_was_counted_on_it(monkeypatch) -> None:
    """A topic's first burst, counted before any scrape showed its series (its agent had
    registered between two scrapes), made series born at 70: `rate()` read them as always
    70, and the success ratio stayed 1 with 70 of 100 dead-lettered (a trial). The first
    scrape shows them at 0, the next what was counted; with nobody scraping for a minute,
    counts go straight on."""
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True)
    counted = registry.get_sample_value

    def refused(topic: str) -> Event:
        letter = _letter("circuit_open", retry_after_ms=100)
        return msgspec.structs.replace(letter, topic=topic, message_id=envelopes.new_id())

    labels = {"kind": "circuit_open", "topic": "flaky"}
    for _ in range(3):
        flow.fold(refused("flaky"), now_ms())
    assert counted("reach_rejections_total", labels) == 0  # the first scrape
    assert counted("reach_rejections_total", labels) == 3  # the next
    flow.fold(refused("flaky"), now_ms())
    assert counted("reach_rejections_total", labels) == 4  # shown already: counted at once
    monkeypatch.setattr(priming, "UNSEEN_FOR_AT_MOST_S", 0.0)  # as if nobody scraped
    for _ in range(2):
        flow.fold(refused("lonely"), now_ms())
    assert counted("reach_rejections_total", {**labels, "topic": "lonely"}) == 2
