"""Pull requests of our own on a durable or ephemeral consumer: a fetch hands over a message
the moment it arrives.

nats-py's ``fetch(n)``, once a first message has come, waits for the other ``n - 1`` until
its timeout: at low load every message waited up to the whole fetch timeout (1 s in the
coordinator, 0.5 s in agents), the stalls of sporadic traffic. Here one pull request at a
time stays open on the consumer (``batch`` = the room the caller had, expiring with the
caller's wait); what it delivers is queued, and :meth:`Puller.fetch` returns what is queued
as soon as anything is. The consumer's ``max_ack_pending`` bounds what can wait in the
queue unacknowledged; :meth:`Puller.close` ends the open request (the server drops a pull
request whose inbox lost its subscriber) and gives back what was queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agentreach.broker.connection import Broker
from agentreach.broker.errors import (
    BrokerError,
    ConsumerNotFound,
    JetStreamError,
    Unavailable,
    translated,
)
from agentreach.broker.immediate import subscribe_immediate

# A request whose end (408) was not seen is taken as ended this long after its expiry.
LOST_AFTER_S = 0.25
HEARTBEAT = "100"
ENDED = {"404", "408", "409"}  # no messages, expired, ended by the server (leader change …)


class Puller:
    """Pulls from ``consumer`` of ``stream`` into a queue of its own inbox."""

    def __init__(self, broker: Broker, stream: str, consumer: str) -> None:
        self._broker = broker
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = broker.new_inbox()
        self._tokens = itertools.count(1)
        self._sub: Subscription | None = None
        self._ready: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._failure: BrokerError | None = None
        self._open: str | None = None  # the reply subject of the request still open
        self._open_left = 0  # messages it may still deliver
        self._open_until = 0.0  # loop time after which it is taken as ended
        self._open_reconnects = 0  # a reconnect ends every request on the old server

    async def open(self) -> Puller:
        with translated(subject=self._next_subject):
            self._sub = await subscribe_immediate(self._broker.nc, f"{self._inbox}.*", self._on_msg)
        return self

    async def close(self) -> None:
        """End the open request and give back what was delivered and not taken."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):  # already gone with its connection
                await sub.unsubscribe()
        while self._ready:
            with contextlib.suppress(Exception):
                await self._ready.popleft().nak()

    async def fetch(self, size: int, wait_s: float) -> list[Msg]:
        """Up to ``size`` messages, as soon as there is one; none after ``wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            self._arrived.clear()
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if self._ready:
                return [self._ready.popleft() for _ in range(min(size, len(self._ready)))]
            now = loop.time()
            if now >= deadline:
                return []
            if not self._is_open(now):
                await self._request(size, wait_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - now):
                    await self._arrived.wait()

    def _is_open(self, now: float) -> bool:
        return (
            self._open is not None
            and self._open_left > 0
            and now < self._open_until
            and self._open_reconnects == self._broker.reconnects
        )

    async def _request(self, size: int, wait_s: float) -> None:
        reply = f"{self._inbox}.{next(self._tokens)}"
        body = msgspec.json.encode({"batch": max(1, size), "expires": int(wait_s * 1e9)})
        with translated(subject=self._next_subject):
            await self._broker.nc.publish(self._next_subject, body, reply=reply)
        self._open, self._open_left = reply, max(1, size)
        self._open_until = asyncio.get_running_loop().time() + wait_s + LOST_AFTER_S
        self._open_reconnects = self._broker.reconnects

    def _on_msg(self, msg: Msg) -> None:
        if msg.reply:  # a stored message: it always comes with its $JS.ACK subject
            self._ready.append(msg)
            self._open_left -= 1
            self._arrived.set()
            return
        status = (msg.headers or {}).get("Status", "")
        if status == HEARTBEAT or msg.subject != self._open:
            return  # an earlier request's end: already replaced
        self._open = None
        if status not in ENDED or "Consumer Deleted" in _description(msg):
            self._failure = _failure(status, msg)
        self._arrived.set()


def _description(msg: Msg) -> str:
    # nats-py keys it by an enum member equal to "Description" (but hashed by its name)
    return next((v for k, v in (msg.headers or {}).items() if k == "Description"), "")


def _failure(status: str, msg: Msg) -> BrokerError:
    description = _description(msg).strip() or f"status {status}"
    if status == "409":
        return ConsumerNotFound(f"pull request ended: {description}")
    if status == "503":
        return Unavailable("JetStream unavailable (503)")
    return JetStreamError(f"pull request refused: {status} {description}")
