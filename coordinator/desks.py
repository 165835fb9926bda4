"""The coordinator's second connection, for what any party may send it as core messages.

Every caller may ask ``reach.ctl.status``, its trace desk and ``reach.call``; every agent
registers and answers probes, under a reply prefix each probe shows it. A flood of any of
them (10 million status requests in 12 s, in a security trial) made the server cut the
coordinator's only connection as a slow consumer: its leases lapsed, its duties stopped,
its stream consumers went with it. These subscriptions live on a connection of their own: a
flood cuts that one, and the connection that holds the leases and consumes the streams
stays up. Each desk queues at most :data:`DESK_PENDING` requests (nats-py drops the rest
as they are read), and the status desk answers at most :data:`STATUS_ANSWERS_PER_S`. Both
connections share one process: a flood still costs it CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from agentreach.broker import Broker, Inbound, Subscription
from agentreach.broker.messages import InboundHandler
from agentreach.coordinator.protection.rate_limits import TokenBucket
from agentreach.envelopes import encode

log = structlog.get_logger("coordinator")

DESK_PENDING = 4096  # requests waiting for a desk's handler; a flood's others are dropped
STATUS_ANSWERS_PER_S = 1000.0  # and as many at once: callers ask on their failure paths
SAID_EVERY_S = 60.0


class DeskConnection(Broker):
    """A :class:`Broker` whose subscriptions queue at most :data:`DESK_PENDING` messages."""

    async def subscribe(
        self, subject: str, handler: InboundHandler | None = None, *, queue: str = "", **limit: int
    ) -> Subscription:
        limit.setdefault("pending_msgs_limit", DESK_PENDING)
        return await super().subscribe(subject, handler, queue=queue, **limit)


def desk_connection(broker: Broker) -> DeskConnection:
    """A connection like ``broker`` (not open yet), for the desks; it seals and checks
    records as ``broker`` does (the same objects: what the coordinator adds to one, both
    have)."""
    desks = DeskConnection(
        broker.url,
        name=f"{broker.name}-desks",
        names=broker.names,
        auth=broker.auth,
        wait=True,
        request_timeout=broker.request_timeout,
        election_budget_s=broker.election_budget_s,
    )
    desks.record_seals, desks.headed_buckets = broker.record_seals, broker.headed_buckets
    desks.dedup_secret = broker.dedup_secret
    return desks


class StatusDesk:
    """Answers ``reach.ctl.status`` with ``status()``, at most :data:`STATUS_ANSWERS_PER_S`
    a second; past that a request is not answered, and that is said once a minute."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status
        self._answers = TokenBucket(STATUS_ANSWERS_PER_S, STATUS_ANSWERS_PER_S)
        self._unanswered, self._said_at = 0, float("-inf")

    async def on_request(self, msg: Inbound) -> None:
        if not msg.reply:
            return
        if self._answers.take() == 0.0:
            await msg.respond(encode(self._status()))
            return
        self._unanswered += 1
        if time.monotonic() - self._said_at >= SAID_EVERY_S:
            self._said_at = time.monotonic()
            log.warning(
                "status requests past the rate left unanswered (a flood?)",
                per_s=STATUS_ANSWERS_PER_S,
                unanswered=self._unanswered,
            )
            self._unanswered = 0
