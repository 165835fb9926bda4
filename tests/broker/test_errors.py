"""How loops around nats calls stop when nats-py swallowed the cancel meant for them."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agentreach.broker import Broker
from agentreach.broker.errors import pause
from agentreach.coordinator.observability.state import Sampled


async def _swallowing_a_cancel() -> None:
    """What nats-py does in places (Python 3.11's ``wait_for`` answering a cancel that came
    in the same turn as the reply): the cancel is consumed, and the call returns."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)


async def _turns(count: int = 10) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_pause_after_a_swallowed_cancel_raises_at_once() -> None:
    async def loop() -> None:
        while True:
            await _swallowing_a_cancel()
            await pause(3600)

    task = asyncio.create_task(loop())
    await _turns()
    task.cancel()
    await _turns()
    assert task.cancelled()


async def test_a_pause_sleeps_when_nothing_asked_the_task_to_stop() -> None:
    task = asyncio.create_task(pause(3600))
    await _turns()
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_stream_sampling_stops_when_its_sample_swallowed_the_cancel(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator took a sampling period (5 s) to stop: its sampler's nats calls had
    swallowed the cancel, and it then slept before looking."""
    sampled = Sampled(broker)
    await sampled.sample()  # a real one first: the loop is as it runs
    assert sampled.replicas == 0
    monkeypatch.setattr(Sampled, "sample", lambda self: _swallowing_a_cancel())
    task = asyncio.create_task(sampled.run())
    await _turns()
    task.cancel()
    await _turns()
    assert task.cancelled()
