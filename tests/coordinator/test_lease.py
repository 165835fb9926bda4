"""A duty held under a KV lease, on a real server: one holder runs it, a stop lets go of it,
and a stop does not wait long for a release the server cannot take."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agentreach.broker import Broker, Bucket
from agentreach.coordinator import lease as lease_module
from agentreach.coordinator.lease import Lease
from agentreach.envelopes import LeaseRecord


async def run_until_cancelled(ran: asyncio.Event) -> None:
    ran.set()
    await asyncio.Event().wait()


async def test_a_stopped_holder_lets_go_of_its_lease(broker: Broker) -> None:
    """Released at the stop, not left to lapse: another replica takes the duty at once."""
    lease, ran = Lease(broker, "duty", "a", ttl_s=30), asyncio.Event()
    holding = asyncio.create_task(lease.hold(lambda: run_until_cancelled(ran)))
    await asyncio.wait_for(ran.wait(), 5)
    leases = await broker.bucket(broker.names.leases_bucket, LeaseRecord)
    held = await leases.get("duty")
    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    assert held is not None and held.value.holder == "a"
    assert await leases.get("duty") is None


async def test_a_stop_does_not_wait_through_an_election_for_the_release(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release the server does not answer (a leader election, a stopped node) is given up
    after a moment: a coordinator's stop took 9 s waiting for it."""
    lease, ran = Lease(broker, "stalled", "a", ttl_s=30), asyncio.Event()
    holding = asyncio.create_task(lease.hold(lambda: run_until_cancelled(ran)))
    await asyncio.wait_for(ran.wait(), 5)

    async def unanswered(self: Bucket, key: str, **_: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Bucket, "delete", unanswered)
    monkeypatch.setattr(lease_module, "RELEASE_WAIT_S", 0.2)
    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(holding, 5)  # without the bound: never
    assert holding.done()
