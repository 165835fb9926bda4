"""Turns per key, first come, first served; and a key's messages in their stored order."""

from __future__ import annotations

import asyncio

from agentreach.coordinator.workflows.turns import StoredOrder, Turns


async def test_the_signals_of_an_instance_are_handled_in_the_order_delivered() -> None:
    """The first handling of instance `i` waits; those after it wait their turn, in order
    (each a task started in delivery order), while another instance's goes on."""
    in_order, handled, release = Turns(), list[str](), asyncio.Event()

    async def handling(instance: str, n: int) -> None:
        async with in_order.turn(instance):
            if (instance, n) == ("i", 0):
                await release.wait()
            handled.append(f"{instance}{n}")

    of_i = [asyncio.create_task(handling("i", n)) for n in range(4)]
    await asyncio.wait_for(handling("j", 0), 5)
    release.set()
    await asyncio.wait_for(asyncio.gather(*of_i), 5)
    assert handled == ["j0", "i0", "i1", "i2", "i3"]


async def test_a_message_is_handled_after_those_stored_before_it_and_delivered_earlier() -> None:
    """Seq 5 of `i` holds; 9 and 7 (stored after it, delivered in that order) wait for it,
    and 9 for 7 too; 3, stored before 5 and delivered after it (again, after a failure),
    waits for nothing, nor does `j`."""
    order, handled, release = StoredOrder(), list[str](), asyncio.Event()

    async def handling(key: str, seq: int) -> None:
        async with order.after_earlier(key, seq):
            if (key, seq) == ("i", 5):
                await release.wait()
            handled.append(f"{key}{seq}")

    held = [asyncio.create_task(handling("i", seq)) for seq in (5, 9, 7)]
    await asyncio.wait_for(asyncio.gather(handling("i", 3), handling("j", 8)), 5)
    assert handled == ["i3", "j8"]
    release.set()
    await asyncio.wait_for(asyncio.gather(*held), 5)
    assert handled == ["i3", "j8", "i5", "i7", "i9"]
