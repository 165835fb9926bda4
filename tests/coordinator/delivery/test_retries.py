"""Backoff and attempt limits: pure logic, no server."""

from __future__ import annotations

import random

import pytest

from agentreach.coordinator.delivery.retries import RetryConfig, backoff_s


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [
        (1, 0.8, 1.2),
        (2, 1.6, 2.4),
        (3, 3.2, 4.8),
        (5, 12.8, 19.2),
        (6, 25.6, 30.0),
        (12, 30.0, 30.0),
    ],
)
def test_backoff_doubles_with_jitter_and_is_capped(attempt, low, high):
    """1, 2, 4 … s with ±20 % jitter, never above 30 s."""
    rng = random.Random(7)
    delays = [backoff_s(attempt, base_s=1.0, cap_s=30.0, rng=rng) for _ in range(200)]
    assert low <= min(delays) and max(delays) <= high
    if high < 30.0:
        assert len(set(delays)) > 100  # jittered, so retries of many tasks do not align


def test_attempts_come_from_config_then_intent_then_default():
    """Per-topic config beats the intent's own setting, which beats the default of 3."""
    config = RetryConfig(attempts_by_topic={"pay": 7})
    assert config.attempts_for("pay", 5) == 7
    assert config.attempts_for("refund", 5) == 5
    assert config.attempts_for("refund", None) == 3
