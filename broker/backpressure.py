"""Waiting for room on a bounded intake subject: ``REACH_TASKS`` keeps at most
``limits.tasks_per_subject`` messages per subject and refuses more (``SubjectFull``), so a
publisher there tries again as the coordinator takes the backlog, until its task's ttl."""

from __future__ import annotations

import asyncio

from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import StreamFull, SubjectFull
from agentreach.logs import get_logger

log = get_logger("broker.backpressure")

# The pauses between tries while a subject is full: doubling from the first to the cap.
ROOM_PAUSE_FIRST_S = 0.05
ROOM_PAUSE_CAP_S = 1.0


async def publish_when_room(
    broker: Broker,
    subject: str,
    data: bytes,
    *,
    headers: dict[str, str] | None,
    within_s: float,
    elections_s: float | None = None,
) -> api.PubAck:
    """Publish, trying again while ``subject`` is full, for up to ``within_s``; raises the
    last :class:`SubjectFull` when no room came by then (nothing was stored). Each try waits
    through elections for up to ``elections_s`` (the broker's budget by default). Any other
    broker error is raised at once."""
    loop = asyncio.get_running_loop()
    give_up_at, pause_s = loop.time() + within_s, ROOM_PAUSE_FIRST_S
    said = False
    while True:
        try:
            return await broker.publish(subject, data, headers=headers, budget_s=elections_s)
        except SubjectFull as exc:
            if loop.time() + pause_s > give_up_at:
                raise
            if isinstance(exc, StreamFull) and not said:  # not a flood's own pace: say so
                log.warning(
                    "the intake is full; waiting for room", error=str(exc), up_to_s=within_s
                )
                said = True
        await asyncio.sleep(pause_s)  # room comes as the coordinator takes the backlog
        pause_s = min(pause_s * 2, ROOM_PAUSE_CAP_S)
