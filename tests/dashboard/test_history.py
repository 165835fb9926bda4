"""The dashboard's own fold: the five metrics' definitions."""

from __future__ import annotations

from agentreach.coordinator.observability.flow import LATENCY_BUCKETS
from agentreach.dashboard.history import History, quantile
from agentreach.envelopes import Event


def event(
    kind: str, *, attempt: int = 1, received_ms: int = 0, topic: str = "x", **detail: object
) -> Event:
    return Event(
        v=1,
        event=kind,
        message_id="m",
        trace_id="t",
        topic=topic,
        attempt=attempt,
        received_ms=received_ms,
        detail=detail,
    )


def test_quantile_interpolates_like_histogram_quantile():
    """Linear within the bucket that holds the rank; the top finite bound past the last."""
    slots = len(LATENCY_BUCKETS) + 1  # and +Inf
    counts = [0] * slots
    counts[3] = 100  # everything in (0.025, 0.05]
    assert abs(quantile(0.5, counts) - 0.0375) < 1e-9
    assert quantile(0.99, [0] * slots) is None
    assert quantile(0.99, [0] * (slots - 1) + [5]) == LATENCY_BUCKETS[-1] == 3600.0


def test_success_and_retry_rates_follow_the_rules_definitions():
    """Success = completed ÷ finished except a sender's mistakes (invalid_envelope, no_route of
    a topic nobody serves); retries ÷ dispatches; 5 min."""
    history = History(step_s=10, window_s=600, period_s=60)
    now = 1_000_000_000
    for _ in range(3):
        history.fold(event("completed", received_ms=now - 50), now)
    history.fold(event("dead_lettered", reason="retries_exhausted"), now)
    history.fold(event("dead_lettered", reason="invalid_envelope"), now)  # the sender's mistake
    served = {"x"}.__contains__
    history.fold(event("dead_lettered", reason="no_route", topic="nobody"), now, served=served)
    history.fold(event("dead_lettered", reason="no_route"), now, served=served)  # x: ours
    history.fold(event("routed"), now)
    history.fold(event("routed", attempt=2), now)
    history.sample(now, queue_fill=0.25, isolated=1)
    values = history.values(now)
    assert values["success_rate"] == 0.6
    assert values["retry_rate"] == 0.5
    assert values["queue_fill"] == 0.25 and values["isolated_agents"] == 1
    assert 0.025 < values["p99_latency"] <= 0.05
    assert history.values(now + 400_000)["success_rate"] is None  # out of the 5 minutes
