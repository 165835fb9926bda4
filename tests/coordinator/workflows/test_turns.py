"""Turns per key, first come, first served."""

from __future__ import annotations

import asyncio

from agentreach.coordinator.workflows.turns import Turns


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
