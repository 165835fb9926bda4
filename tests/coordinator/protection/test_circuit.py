"""The circuit breaker's transitions and window (pure logic, no server)."""

from __future__ import annotations

from agentreach.coordinator import BreakerConfig
from agentreach.coordinator.protection.circuit import (
    BreakerRecord,
    Window,
    admission,
    after_trial,
    opened,
    overdue,
    trip_reason,
    with_trial,
)

CONFIG = BreakerConfig(min_calls=5, error_ratio=0.4, open_s=10, trial_calls=2, trial_timeout_s=3)
CLOSED = BreakerRecord(agent_id="x", intent="pay")


def test_trips_at_the_ratio_only_with_enough_calls() -> None:
    """≥ 40 % errors opens it, but not before min_calls calls."""
    assert trip_reason(4, 4, CONFIG) is None
    assert trip_reason(5, 1, CONFIG) is None
    assert trip_reason(5, 2, CONFIG) == "2 of 5 calls failed in 300 s"


def test_window_forgets_old_seconds_and_calls_before_a_reset() -> None:
    """Counts cover the last window_s only, and nothing before counted_from."""
    window = Window(span_s=60)
    window.add(0, ok=False)
    window.add(30_000, ok=True)
    window.add(30_500, ok=False)
    assert window.counts(now_ms=31_000) == (3, 2)
    assert window.counts(now_ms=70_000) == (2, 1)  # the call at 0 s left the window
    assert window.counts(now_ms=70_000, since_ms=30_600) == (0, 0)


def test_open_blocks_until_open_s_then_offers_a_trial() -> None:
    """Open: blocked for open_s; then a trial; a half-open breaker takes trial_calls trials."""
    broken = opened(CLOSED, 1_000, "5 of 5 calls failed", CONFIG)
    assert admission(broken, 5_000, 2).verdict == "blocked"
    assert "circuit of pay open" in admission(broken, 5_000, 2).why
    assert admission(broken, 11_000, 2).verdict == "trial"
    half = with_trial(broken, "m1", 11_000, CONFIG)
    assert half.state == "half_open" and half.trials == ["m1"]
    assert admission(half, 11_100, 2).verdict == "trial"
    full = with_trial(half, "m2", 11_100, CONFIG)
    assert admission(full, 11_200, 2).verdict == "blocked"


def test_trials_close_it_or_open_it_again() -> None:
    """All trials good → closed with a fresh window; one bad → open again."""
    half = with_trial(
        with_trial(opened(CLOSED, 0, "r", CONFIG), "m1", 10_000, CONFIG), "m2", 10_000, CONFIG
    )
    one = after_trial(half, "m1", ok=True, now_ms=10_500, needed=2, config=CONFIG)
    assert one is not None and one.state == "half_open" and one.trials == ["m2"]
    closed = after_trial(one, "m2", ok=True, now_ms=10_600, needed=2, config=CONFIG)
    assert closed is not None and closed.state == "closed" and closed.counted_from_ms == 10_600
    again = after_trial(half, "m2", ok=False, now_ms=10_700, needed=2, config=CONFIG)
    assert again is not None and again.state == "open" and again.open_until_ms == 20_700
    assert after_trial(half, "not-a-trial", ok=True, now_ms=1, needed=2, config=CONFIG) is None


def test_trials_that_never_report_do_not_leave_it_stuck() -> None:
    """Past the trial deadline the breaker blocks, and the sweep opens it again."""
    half = with_trial(opened(CLOSED, 0, "r", CONFIG), "lost", 10_000, CONFIG)
    assert overdue(half, 12_000, CONFIG) is None
    assert admission(half, 13_000, 2).verdict == "blocked"
    reopened = overdue(half, 13_000, CONFIG)
    assert reopened is not None and reopened.state == "open"
    assert admission(reopened, 23_000, 2).verdict == "trial"  # and later tries again
