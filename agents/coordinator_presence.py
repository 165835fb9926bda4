"""Whether a coordinator runs, asked the way ``reach`` asks (``reach.ctl.status``, which
every replica answers): so that a caller whose tasks nothing routes hears why, instead of
a wait that blames the agents."""

from __future__ import annotations

import asyncio

from agentreach.broker import Broker, BrokerError, NoResponders
from agentreach.logs import get_logger

log = get_logger("agents.client")

NO_COORDINATOR = (
    "no coordinator is running (none answered for 3 s; start one: reach up / reach coordinator)"
)
ASK_S = 0.5  # a replica answers in milliseconds; "nobody listens" comes back at once
COORDINATOR_SILENT = (
    "no coordinator answered whether it runs within 0.5 s (one may be stopped, overloaded or"
    " cut off), or this client's connection is down"
)
# Just after a server restart the coordinators are still reconnecting (each waits 0.5-1.5 s
# between attempts) while this client may be back already: "nobody listens" is said only
# when it lasts this long, not of coordinators a second away from answering.
NONE_FOR_S = 3.0
ASK_AGAIN_S = 0.5
WARN_EVERY_S = 60.0  # a publisher asks at most this often


async def coordinator_runs(
    broker: Broker, *, timeout_s: float = ASK_S, none_for_s: float = NONE_FOR_S
) -> bool | None:
    """True when a coordinator answers; False when none listens (the server says so at
    once) for ``none_for_s``; None when it cannot be told: no answer in time, no
    connection, or credentials without the right to ask."""
    deadline = asyncio.get_running_loop().time() + none_for_s
    while True:
        try:
            await broker.request(broker.names.status, timeout=timeout_s)
        except NoResponders:
            if asyncio.get_running_loop().time() >= deadline:
                return False
        except BrokerError:
            return None
        else:
            return True
        await asyncio.sleep(ASK_AGAIN_S)  # polling the server's "nobody listens"; no event


class PublishWarnings:
    """After a publish, asks in the background whether a coordinator runs, at most once a
    minute, and logs a warning when none does: the task is queued all the same, and waits
    in ``REACH_TASKS`` until one starts, within its ttl. The publish never waits for it."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._asked_at: float | None = None
        self._asking: set[asyncio.Task[None]] = set()

    def published(self, topic: str, message_id: str, *, taken: bool = True) -> None:
        """A task was published (``taken``: not as a duplicate of a stored message id): ask,
        unless asked within the last minute."""
        if not taken:
            log.warning(
                "task not taken in: its message id was stored already (sent within the"
                " duplicate window, 2 min); nothing new is queued, and the first message's"
                " outcome is the answer",
                topic=topic,
                message_id=message_id,
            )
        now = asyncio.get_running_loop().time()
        if self._asked_at is not None and now - self._asked_at < WARN_EVERY_S:
            return
        self._asked_at = now
        asking = asyncio.create_task(self._ask(topic, message_id))
        self._asking.add(asking)
        asking.add_done_callback(self._asking.discard)

    async def close(self) -> None:
        """Stop asking. Cancelled before any await of the closing client, so a program that
        publishes and closes at once (``reach publish``, which warns itself) is not told."""
        for asking in self._asking:
            asking.cancel()
        await asyncio.gather(*self._asking, return_exceptions=True)

    async def _ask(self, topic: str, message_id: str) -> None:
        if await coordinator_runs(self._broker) is False:
            log.warning(
                f"{NO_COORDINATOR}: the task waits in the task stream until one starts,"
                " within its ttl",
                topic=topic,
                message_id=message_id,
            )
