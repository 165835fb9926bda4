"""Watermarks of a dispatch queue, and how a queue passed over is explained."""

from __future__ import annotations

import asyncio

from agentreach.broker import Broker, Names
from agentreach.broker.direct import subject_counts
from agentreach.coordinator.protection import queues as queues_module
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


def test_a_queue_is_never_said_to_hold_more_than_its_capacity():
    """Its stream refuses what passes its capacity; dispatches on their way were counted too,
    and a drill's letter said "(262/200)": past the capacity, which cannot be."""
    queues = QueueDepths(_NoBroker(), QueueConfig())  # type: ignore[arg-type]
    slot = ("worker-1", "P1")
    queues._depths[slot] = 200
    for n in range(62):
        queues.reserve(*slot, f"on-its-way-{n}")
    assert queues.depth(*slot) == 262
    assert queues.why_full(*slot) == "P1 queue above the high watermark (200/200)"


async def test_a_read_takes_over_the_dispatches_it_includes_and_no_others(broker):
    """A dispatch is counted apart until a read includes it (stored at or before the
    stream's last sequence): then once, by the read. One stored later, or still in flight,
    stays counted apart (a read used to forget them all, or count them twice)."""
    queues = QueueDepths(broker, QueueConfig())
    ack = await broker.publish(broker.names.dispatch("a1", "P1"), b"{}")
    queues.reserve("a1", "P1", "stored-before")
    queues.stored("a1", "P1", "stored-before", ack.seq)
    queues.reserve("a1", "P1", "stored-after")
    queues.stored("a1", "P1", "stored-after", ack.seq + 1)  # as if stored after the read
    queues.reserve("a1", "P1", "in-flight")
    assert queues.depth("a1", "P1") == 3
    await queues.refresh()
    assert queues.depth("a1", "P1") == 3  # 1 read, 2 apart
    queues.release("a1", "P1", "in-flight")
    assert queues.depth("a1", "P1") == 2


async def test_a_routing_during_a_read_sees_the_queue_full(broker, monkeypatch):
    """A read covers the three priorities one after another. A routing while the later ones
    were read saw a P0 task dropped from the unread but not yet in the depths: the full queue
    read 0/10, and a queue above the high watermark could be judged empty and fed again."""
    queues = QueueDepths(broker, QueueConfig())
    for n in range(8):
        ack = await broker.publish(broker.names.dispatch("a1", "P0"), b"{}")
        queues.reserve("a1", "P0", f"task-{n}")
        queues.stored("a1", "P0", f"task-{n}", ack.seq)
    assert queues.why_full("a1", "P0") == "P0 queue above the high watermark (8/10)"
    reading_p1, go_on = asyncio.Event(), asyncio.Event()

    async def paused_at_p1(broker: Broker, stream: str, subject: str) -> tuple[dict, int]:
        if stream == broker.names.dispatch_stream("P1"):
            reading_p1.set()
            await go_on.wait()
        return await subject_counts(broker, stream, subject)

    monkeypatch.setattr(queues_module, "subject_counts", paused_at_p1)
    refreshing = asyncio.create_task(queues.refresh())
    await reading_p1.wait()
    during = queues.depth("a1", "P0"), queues.why_full("a1", "P0")
    go_on.set()
    await refreshing
    assert during == (8, "P0 queue above the high watermark (8/10)")
    assert queues.depth("a1", "P0") == 8
