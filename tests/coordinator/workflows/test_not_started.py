"""A signal or cancel of an instance not started yet: looked at again, less and less often."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from agentreach.coordinator.workflows.signals import NOT_STARTED_LOOK_S, look_again


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
