"""The adaptive heartbeat policy: pure logic, no server."""

from __future__ import annotations

from agentreach.coordinator.liveness.cadence import Cadence


def test_after_a_scare_the_interval_halves_until_healthy_again():
    """Recovery asks for half the base; after N healthy beats, the base again."""
    cadence = Cadence(base_s=10.0, beats_needed=3)
    assert cadence.after_recovery() == 5.0
    assert [cadence.on_beat(in_flight=1) for _ in range(3)] == [None, None, 10.0]


def test_an_idle_agent_beats_at_twice_the_base_until_work_arrives():
    """N idle beats double the interval; the first busy beat restores it."""
    cadence = Cadence(base_s=10.0, beats_needed=3)
    assert [cadence.on_beat(in_flight=0) for _ in range(4)] == [None, None, 20.0, None]
    assert cadence.on_beat(in_flight=2) == 10.0
    assert cadence.on_beat(in_flight=2) is None
