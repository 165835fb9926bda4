"""Every outcome agents report (completed, failed, expired), seen by every replica.

A private consumer per replica, starting ``since_s`` back, so views that are
rebuilt from outcomes (breaker windows, queue depths) are the same on every
replica and survive a restart without writing per task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import structlog

from agentreach import envelopes
from agentreach.broker import Broker
from agentreach.broker.consume import follow
from agentreach.broker.errors import honour_cancellation
from agentreach.envelopes import DecodeError, Event, now_ms

log = structlog.get_logger("coordinator.outcome_feed")

OUTCOMES = ("completed", "failed", "expired")
# Called with the event and the broker's time of storing it, in ms.
OutcomeHandler = Callable[[Event, int], Awaitable[None]]


async def follow_outcomes(
    broker: Broker, *, since_s: float, handlers: Sequence[OutcomeHandler]
) -> None:
    """Hand each outcome event to every handler, oldest first, until cancelled."""
    names = broker.names
    async for msg in follow(
        broker,
        stream=names.events_stream,
        filter_subjects=tuple(names.events_of_kind(kind) for kind in OUTCOMES),
        since_ms=now_ms() - int(since_s * 1000),
    ):
        honour_cancellation()
        try:
            event = envelopes.decode_stored_event(msg.data, msg.headers)
        except DecodeError:
            continue
        if event.agent_id != names.sender_of(msg.subject):
            continue  # not that agent's to say (the outcome handling raises the alert)
        stored_ms = msg.timestamp_ms
        for handle in handlers:
            try:
                await handle(event, stored_ms)
            except Exception:  # one failing view must not stop the others
                log.exception("outcome handling failed", message_id=event.message_id)
