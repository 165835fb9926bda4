"""A signal or cancel of an instance not started yet: looked at again, less and less often."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from structlog.testing import capture_logs

from agentreach.coordinator.workflows.signals import (
    NOT_STARTED_LOOK_S,
    NOT_STARTED_LOOKS,
    look_again,
)


def test_a_signal_of_no_instance_is_looked_at_again_less_and_less_often_then_dropped():
    """Every 0.5 s for 15 s, a caller's 5,000 signals to no instance were 150,000 deliveries
    before every workflow's replies, timers and signals (a security re-test): the first look
    again comes as soon, then each twice as far apart, about 15 s in all."""
    waits = []
    for delivered in range(1, 100):
        wait = look_again(SimpleNamespace(num_delivered=delivered), "signal", "nope-1")  # type: ignore[arg-type]
        if wait is None:
            break
        waits.append(wait)
    assert waits[0] == NOT_STARTED_LOOK_S
    assert all(b == 2 * a for a, b in itertools.pairwise(waits))
    assert 10 <= sum(waits) <= 20 and len(waits) <= 6


def test_dropping_many_is_said_a_few_times_a_minute():
    """1,500 signals to instances never started made 1,500 warnings (a drill)."""
    last = SimpleNamespace(num_delivered=NOT_STARTED_LOOKS)
    with capture_logs() as logs:
        for n in range(50):
            assert look_again(last, "signal", f"never-{n}") is None  # type: ignore[arg-type]
    said = [line for line in logs if line["event"] == "signal of no workflow instance; dropped"]
    assert len(said) <= 5  # some may have been said by an earlier test of this process
