"""The coordinator's second connection, for what any party may send it as core messages.

Every caller may ask ``reach.ctl.status``, its trace desk and ``reach.call``; every agent
registers and answers probes, under a reply prefix each probe shows it. A flood of any of
them (10 million status requests in 12 s, in a security trial) made the server cut the
coordinator's only connection as a slow consumer: its leases lapsed, its duties stopped,
its stream consumers went with it. These subscriptions live on a connection of their own: a
flood cuts that one, and the connection that holds the leases and consumes the streams
stays up. Each desk queues at most :data:`DESK_PENDING` requests (nats-py drops the rest
as they are read), and the status desk answers at most :data:`STATUS_ANSWERS_PER_S`.

Both connections share one process, and reading a flood costs it: a re-test's 12 s status
flood still starved the whole process for 16-26 s (the event loop stalled up to 10 s at a
time), though no lease was lost. So a desk that takes more than its ``per_s`` requests in a
second stops listening for :data:`COOL_S` (a :class:`GuardedDesk`): without its
subscription the server drops the flood, and reading what was already sent is a dictionary
miss per message. Its honest askers meanwhile hear "no responders", as when no coordinator
runs, and are asked to try again. The registrations' desk too: an agent that hears no
responders there asks ``reach.ctl.status`` before it registers on its own (a crowd of 200
that registered alone at once, past the registration rate, taught that), and the refused
are given turns one after another (a crowd told "20 ms" each came back as a flood).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from agentreach.broker import Broker, BrokerError, Inbound, Subscription
from agentreach.broker.messages import InboundHandler
from agentreach.coordinator.protection.rate_limits import TokenBucket
from agentreach.envelopes import encode

log = structlog.get_logger("coordinator")

DESK_PENDING = 4096  # requests waiting for a desk's handler; a flood's others are dropped
STATUS_ANSWERS_PER_S = 1000.0  # and as many at once: callers ask on their failure paths
SAID_EVERY_S = 60.0
COOL_S = 5.0  # how long a flooded desk does not listen
STATUS_FRESH_S = 0.1  # how old a status answer may be


class DeskConnection(Broker):
    """A :class:`Broker` whose subscriptions queue at most :data:`DESK_PENDING` messages,
    with the desks it keeps open (:meth:`desk`), each stopped when the connection closes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._desks: dict[str, GuardedDesk] = {}
        self.link.on_dropped = self._dropped

    def _dropped(self, subject: str) -> None:
        """A desk's queue is full and nats-py drops what comes: flooded, whatever its rate
        (reading a flood can starve the handler that counts it)."""
        if (desk := self._desks.get(subject)) is not None:
            desk.flooded()

    async def subscribe(
        self, subject: str, handler: InboundHandler | None = None, *, queue: str = "", **limit: int
    ) -> Subscription:
        limit.setdefault("pending_msgs_limit", DESK_PENDING)
        return await super().subscribe(subject, handler, queue=queue, **limit)

    async def desk(
        self, subject: str, handler: InboundHandler, *, per_s: float, queue: str = ""
    ) -> None:
        """Answer requests on ``subject`` with ``handler`` while open, not listening for a
        while after a second of more than ``per_s`` of them (see :class:`GuardedDesk`)."""
        desk = GuardedDesk(self, subject, handler, per_s=per_s, queue=queue)
        await desk.open()
        self._desks[subject] = desk

    async def __aexit__(self, *exc_info: Any) -> None:
        for desk in self._desks.values():
            await desk.stop()
        self._desks.clear()
        await super().__aexit__(*exc_info)


class GuardedDesk:
    """One desk's subscription, dropped for :data:`COOL_S` after a second of more than
    ``per_s`` requests, then made again."""

    def __init__(
        self,
        desks: Broker,
        subject: str,
        handler: InboundHandler,
        *,
        per_s: float,
        queue: str = "",
    ) -> None:
        self._desks, self._subject, self._handler = desks, subject, handler
        self._per_s, self._queue = per_s, queue
        self._sub: Subscription | None = None
        self._cooling: asyncio.Task[None] | None = None
        self._second, self._taken = 0.0, 0

    async def open(self) -> None:
        self._sub = await self._desks.subscribe(self._subject, self._on, queue=self._queue)

    async def stop(self) -> None:
        if self._cooling is not None:
            self._cooling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cooling

    async def _on(self, msg: Inbound) -> None:
        now = time.monotonic()
        if now - self._second >= 1.0:
            self._second, self._taken = now, 0
        self._taken += 1
        if self._taken <= self._per_s:
            await self._handler(msg)
        else:
            self.flooded()

    def flooded(self) -> None:
        """Stop listening for a while (once, until it listens again)."""
        if self._cooling is None:
            self._cooling = asyncio.create_task(self._cool(), name=f"cooling {self._subject}")

    async def _cool(self) -> None:
        log.warning(
            "a desk flooded: not listening for a while (its askers hear no responders)",
            subject=self._subject,
            per_s=self._per_s,
            for_s=COOL_S,
        )
        try:
            if self._sub is not None:
                with contextlib.suppress(BrokerError):
                    await self._sub.close()
            await asyncio.sleep(COOL_S)
            await self.open()
            log.info("a flooded desk listens again", subject=self._subject)
        except BrokerError as exc:  # the connection closing: stop() comes next
            log.warning("a flooded desk not opened again", subject=self._subject, error=str(exc))
        finally:
            self._cooling = None


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
        self._answer, self._answered_at = b"", float("-inf")

    async def on_request(self, msg: Inbound) -> None:
        if not msg.reply:
            return
        if self._answers.take() == 0.0:
            await msg.respond(self._current())
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

    def _current(self) -> bytes:
        """The status, made at most every :data:`STATUS_FRESH_S` (a burst of askers)."""
        now = time.monotonic()
        if now - self._answered_at >= STATUS_FRESH_S:
            self._answer, self._answered_at = encode(self._status()), now
        return self._answer
