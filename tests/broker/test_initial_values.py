"""When a watch's initial values are through: the boundary from the consumer's info, not the
first ``pending`` of 0 (nats-io/nats.py#842, #995)."""

from __future__ import annotations

import asyncio

from agentreach.broker.initial_values import InitialValues


def _counting(through: asyncio.Event | None = None) -> tuple[InitialValues, list[int]]:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        if through is not None:
            through.set()

    return InitialValues(call, settle_s=0.05), calls


async def test_an_empty_bucket_is_through_at_once():
    initial, calls = _counting()
    initial.expect(sent=0, pending=0)
    assert calls == [1] and initial.done


async def test_values_still_on_their_way_are_waited_for():
    """The info says nothing pending, but three were sent and none has arrived yet."""
    initial, calls = _counting()
    initial.expect(sent=3, pending=0)
    initial.delivered(2)
    initial.delivered(1)
    assert calls == []
    initial.delivered(0)
    assert calls == [1]


async def test_a_stale_pending_of_zero_does_not_end_the_initial_values():
    """Revision 1996 says pending 0; 1997 and 1998, sent at the start, come behind it."""
    initial, calls = _counting()
    initial.expect(sent=0, pending=3)
    initial.delivered(0)
    initial.delivered(10)
    initial.delivered(9)
    assert calls == [1]


async def test_deliveries_before_the_info_count_once_it_is_read():
    initial, calls = _counting()
    initial.delivered(1)
    initial.delivered(0)
    assert calls == []
    initial.expect(sent=2, pending=0)
    assert calls == [1]
    initial.delivered(0)  # later changes call nothing again
    assert calls == [1]


async def test_values_removed_before_delivery_end_the_wait_after_the_settle_time():
    through = asyncio.Event()
    initial, calls = _counting(through)
    initial.expect(sent=0, pending=3)
    initial.delivered(0)  # the other two expired before they were sent
    assert calls == []
    async with asyncio.timeout(2):
        await through.wait()
    assert calls == [1]


async def test_a_delivery_during_the_settle_time_restarts_it():
    initial, calls = _counting()
    initial.expect(sent=0, pending=4)
    initial.delivered(0)
    initial.delivered(5)  # pending again: the zero was stale, the timer is off
    await asyncio.sleep(0.1)
    assert calls == []
    initial.cancel()
