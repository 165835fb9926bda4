"""Watermarks of a dispatch queue, and how a queue passed over is explained."""

from __future__ import annotations

from agentreach.broker import Names
from agentreach.coordinator.protection.queues import QueueConfig, QueueDepths


class _NoBroker:
    names = Names()


def test_a_queue_between_the_watermarks_is_explained_as_hysteresis():
    """At 170/200 the queue is above the high watermark; drained to 146/200 it is still not
    fed, 'still above the low watermark (hysteresis)'; at 100/200 it is fed again."""
    queues = QueueDepths(_NoBroker(), QueueConfig())  # type: ignore[arg-type]
    slot = ("worker-1", "P1")
    for depth, why in (
        (170, "P1 queue above the high watermark (170/200)"),
        (146, "P1 queue still above the low watermark (hysteresis): 146/200, fed again at 100"),
        (100, None),
    ):
        queues._depths[slot] = depth
        queues._judge(slot)
        assert queues.why_full(*slot) == why
    assert slot in queues.slots()
