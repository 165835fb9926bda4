"""Asking for a registration slot, against a real nats-server."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from agentreach.agents import registration
from agentreach.broker import Broker
from tests.support import until_true

SILENT = "the registrations' desk does not listen and reach.ctl.status did not answer in time"


async def test_an_unanswered_status_desk_is_asked_again_not_taken_for_no_coordinator(
    broker: Broker, monkeypatch
):
    """Nobody at the registrations' desk, and `reach.ctl.status` unanswered in time: a CI run's
    flooded desks connection answered too late, and the agent registered on its own beside a
    running coordinator. It asks again; once the server says nobody listens, it registers
    on its own."""
    monkeypatch.setattr(registration, "SLOT_TIMEOUT_S", 0.3)
    silent = await broker.subscribe(broker.names.status)  # listens, never answers
    await broker.flush()
    with capture_logs() as logs:
        slot = asyncio.create_task(registration.await_slot(broker, "slow-status"))
        await until_true(lambda: _said(logs, SILENT), timeout=10)
        assert not slot.done()
        await silent.close()
        assert await asyncio.wait_for(slot, timeout=15) is None
    assert await _said(logs, "no coordinator answered the registration; registering directly")


async def _said(logs: list[dict], start: str) -> bool:
    return any(entry["event"].startswith(start) for entry in logs)
