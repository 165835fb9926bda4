"""The waits of tasks that cannot be routed now: their pace, and one line a reason and topic
every few seconds (a burst of 2,000 tasks said it 2,700 times in a second)."""

from __future__ import annotations

from structlog.testing import capture_logs

from agentreach.coordinator.routing.waits import Waits
from agentreach.envelopes import Task


def _task(n: int, topic: str = "quick") -> Task:
    return Task(v=1, message_id=f"m{n}", trace_id=f"m{n}", topic=topic)


def test_a_burst_of_waiting_tasks_is_said_once_per_reason_and_topic():
    waits = Waits()
    with capture_logs() as logs:
        for n in range(2_000):
            waits.room_wait(_task(n), 0, 30_000, limit_s=5)
            waits.agent_wait(_task(n), 0, 30_000)
        waits.agent_wait(_task(0, "other"), 0, 30_000)
    said = [(line["event"], line["topic"]) for line in logs]
    assert sorted(said) == [
        ("every queue is full; tasks wait", "quick"),
        ("no agent can take it now; tasks wait", "other"),
        ("no agent can take it now; tasks wait", "quick"),
    ]
    assert len(waits.waiting_for_room) == 2_000


def test_waits_grow_and_end():
    waits = Waits()
    held = _task(9, "t")
    assert waits.agent_wait(held, 0, 30_000) == 0.05
    assert waits.agent_wait(held, 10, 30_000) == 1.0
    assert waits.agent_wait(held, 60, 30_000) == 10.0  # after a minute of waiting
    assert waits.agent_wait(held, 60, 2_000) == 2.01  # never past its ttl
    assert waits.room_wait(_task(1), 0, 30_000, limit_s=0) is None  # waited its full_wait_s
    assert list(waits.waiting_for_room) == []
    assert waits.room_wait(_task(2), 0, 30_000, limit_s=5) == 0.05
    waits.done(_task(2))
    assert list(waits.waiting_for_room) == []


def test_tasks_held_for_an_agent_are_counted_by_topic_until_routed_or_past_their_look():
    """The `reach_tasks_held` gauge: a topic whose agents are all gone keeps its tasks held
    while other topics flow (the global stranded alert never fired then)."""
    waits = Waits()
    for n in range(3):
        waits.agent_wait(_task(n, "strand"), 0, 30_000)
    waits.agent_wait(_task(9, "other"), 0, 30_000)
    assert waits.held_by_topic() == {"strand": 3, "other": 1}
    waits.done(_task(9, "other"))  # routed after all
    waits.done(_task(0, "strand"))
    assert waits.held_by_topic() == {"strand": 2}
    waits.agent_wait(_task(1, "strand"), 0, 0)  # looked at again at once, and no margin left
    waits._held[(None, "m1")] = ("strand", 0.0)  # past its look and margin: another replica's now
    assert waits.held_by_topic() == {"strand": 1}


def test_one_caller_s_wait_for_room_is_not_another_s_under_the_same_id():
    """A task sent under alice's id before hers waited for room: hers inherited its wait's
    start and gave up early, the other's wait counted as its own."""
    waits = Waits()
    own = Task(v=1, message_id="m1", trace_id="m1", topic="quick", caller="mallory")
    alice = Task(v=1, message_id="m1", trace_id="m1", topic="quick", caller="alice")
    assert waits.room_wait(own, 0, 30_000, limit_s=5) == 0.05
    waits._full_since[("mallory", "m1")] -= 10  # mallory's began 10 s ago, and goes on
    assert waits.room_wait(alice, 0, 30_000, limit_s=5) == 0.05  # alice's begins now
