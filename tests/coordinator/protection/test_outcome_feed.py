"""The outcome feed (breaker windows, queue depths) counts what agents reported, and not a
server's answer stored where someone aimed it: an agent had five forged `failed` events in
another agent's name stored so (a direct get of its own key, the reply aimed at the event
subject), and that agent was isolated, its callers refused with `circuit_open`."""

from __future__ import annotations

import asyncio
import contextlib

from agentreach.broker import Broker
from agentreach.broker.lifecycle import event_message
from agentreach.coordinator.protection.outcome_feed import follow_outcomes
from agentreach.envelopes import Event, encode


def _failed(message_id: str) -> Event:
    return Event(
        v=1, event="failed", message_id=message_id, trace_id=message_id, topic="work",
        attempt=1, agent_id="alpha", caller="alice", detail={},
    )  # fmt: skip


async def test_a_failure_stored_as_a_server_s_answer_is_not_counted(broker: Broker) -> None:
    names = broker.names
    own = f"$KV.{names.executions_bucket}.x.forged.mallory"
    await broker.publish(own, encode(_failed("forged")))
    subject, _, _ = event_message(broker, _failed("forged"), sender="alpha")
    direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
    await broker.nc.publish(direct, b"", reply=subject)  # stored as alpha's, by the server
    subject, data, headers = event_message(broker, _failed("real"), sender="alpha")
    await broker.publish(subject, data, headers=headers)  # alpha's own, after it

    seen: list[str] = []
    real = asyncio.Event()

    async def count(event: Event, stored_ms: int) -> None:
        seen.append(event.message_id)
        if event.message_id == "real":
            real.set()

    feed = asyncio.create_task(follow_outcomes(broker, since_s=60, handlers=[count]))
    try:
        await asyncio.wait_for(real.wait(), 10)
    finally:
        feed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feed
    assert seen == ["real"]
