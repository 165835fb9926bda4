"""JetStream publishes answered on one subscription per connection, with no timer per message.

nats-py's ``js.publish`` is a request: a fresh future, an ``asyncio.wait_for`` timer and a
JSON parse per message (a tenth of the coordinator's CPU under load). Here every publish of
a connection is answered on its one reply subscription (``broker.reply_inbox``), acks are
decoded with msgspec, and one reaper fails the publishes whose time is up. A writer of many
independent messages (liveness verdicts and events) sends them all with
:meth:`PipelinedPublisher.publish_all`, then waits once. Messages reach the server in the
order they are published, so a stream stores them in that order.

Failures are raised as nats-py raises them (``NoStreamResponseError`` when no stream
answers, ``nats.errors.TimeoutError``, ``APIError`` subclasses), so
:func:`agentreach.broker.failover.through_elections` tells elections from refusals as before.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import nats.aio.msg
import nats.errors
import nats.js.errors
from nats.js import api

from agentreach.broker.dedup import MSG_ID
from agentreach.broker.errors import BrokerError, translate, translated
from agentreach.broker.reply_inbox import ReplyInbox
from agentreach.broker.tasks import cancel_and_wait

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

REAP_EVERY_S = 0.05  # how late a timeout may be noticed


class Outgoing(NamedTuple):
    """One message for a stream."""

    subject: str
    data: bytes
    headers: dict[str, str] | None = None


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool | None = None
    domain: str | None = None
    error: dict[str, object] | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


class PipelinedPublisher:
    """Publishes and collects acks for one connection (see the module's docstring)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._inbox = broker.shared(ReplyInbox)
        self._waiting: dict[str, asyncio.Future[api.PubAck]] = {}
        self._deadlines: list[tuple[float, str]] = []
        # Publishes with a Nats-Msg-Id: the connection's breaks when each was sent. Sent before
        # a break, its ack went to the connection that broke: once back, it fails as timed out
        # at once, and is made again (deduplicated), instead of waiting out its timeout (a
        # trial's rolling restart: a write in flight as a node exited took 5 s).
        self._resendable: dict[str, int] = {}
        self._breaks_seen = broker.link.breaks
        self._reaper: asyncio.Task[None] | None = None

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | None,
        timeout_s: float,
        since_break: int | None = None,
    ) -> api.PubAck:
        """One message, stored: its ack, or the error nats-py would raise; ConnectionBroke,
        unsent, once the connection broke after ``since_break`` (``link.breaks`` then)."""
        future = await self._send(Outgoing(subject, data, headers), timeout_s, since_break)
        return await future

    async def publish_all(
        self, messages: Sequence[Outgoing], *, timeout_s: float
    ) -> list[BrokerError | None]:
        """Publish every message, then wait up to ``timeout_s`` for all their acks: for each,
        None when it is stored, or the error (a timeout, a stream without a leader, a refusal).
        ``headers`` are sealed here (see :meth:`Broker.sealed`).

        A message that timed out may have been stored; one refused or unanswered was not.
        """
        futures = []
        for message in messages:
            sealed = message._replace(headers=self._broker.sealed(message.headers))
            futures.append(await self._send(sealed, timeout_s))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        return [
            None if isinstance(outcome, api.PubAck) else _as_broker_error(outcome, message.subject)
            for outcome, message in zip(outcomes, messages, strict=True)
        ]

    async def close(self) -> None:
        if self._reaper is not None:
            await cancel_and_wait(self._reaper)
        for token in list(self._waiting):
            future = self._done_with(token)
            if future is not None and not future.done():
                future.set_exception(nats.errors.ConnectionClosedError())

    async def _send(
        self, message: Outgoing, timeout_s: float, since_break: int | None = None
    ) -> asyncio.Future[api.PubAck]:
        nc = self._broker.nc
        # On this publish's clock (raises as an unanswered one does).
        await self._broker.link.unbroken(since_break, message.subject, timeout_s)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[api.PubAck] = loop.create_future()
        token, reply = await self._inbox.expect(lambda msg: self._on_ack(token, msg))
        self._waiting[token] = future
        if message.headers and MSG_ID in message.headers:
            self._resendable[token] = self._broker.link.breaks
        heapq.heappush(self._deadlines, (loop.time() + timeout_s, token))
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="publish-acks-reaper")
        subject, data, headers = message
        try:
            with translated(subject=subject):
                await nc.publish(subject, data, reply=reply, headers=headers)
        except BaseException:
            self._done_with(token)
            raise
        return future

    def _done_with(self, token: str) -> asyncio.Future[api.PubAck] | None:
        self._inbox.forget(token)
        self._resendable.pop(token, None)
        return self._waiting.pop(token, None)

    def _on_ack(self, token: str, msg: nats.aio.msg.Msg) -> None:
        future = self._done_with(token)
        if future is None or future.done():
            return  # timed out already
        try:
            future.set_result(_ack_of(msg))
        except Exception as exc:  # the publisher gets it, as it would from nats-py
            future.set_exception(exc)

    async def _reap(self) -> None:
        """Fail the publishes whose time is up; ends when none is waiting."""
        loop = asyncio.get_running_loop()
        while self._waiting:
            await asyncio.sleep(REAP_EVERY_S)
            now = loop.time()
            while self._deadlines and self._deadlines[0][0] <= now:
                self._time_up(heapq.heappop(self._deadlines)[1])
            breaks = self._broker.link.breaks
            if breaks != self._breaks_seen and self._broker.connected:  # back: once per break
                self._breaks_seen = breaks
                for token in [t for t, sent in self._resendable.items() if sent != breaks]:
                    self._time_up(token)
        self._deadlines.clear()  # every entry left belongs to an answered publish

    def _time_up(self, token: str) -> None:
        future = self._done_with(token)
        if future is not None and not future.done():
            future.set_exception(nats.errors.TimeoutError())


def _ack_of(msg: nats.aio.msg.Msg) -> api.PubAck:
    """The stream's answer; raises as nats-py's ``js.publish`` does."""
    if msg.headers and msg.headers.get("Status") == "503":
        raise nats.js.errors.NoStreamResponseError
    try:
        ack = _decode_ack(msg.data)
    except msgspec.DecodeError as exc:
        raise nats.js.errors.APIError(description=f"unreadable ack: {msg.data[:200]!r}") from exc
    if ack.error is not None:
        try:
            nats.js.errors.APIError.from_error(ack.error)  # raises the error's own class
        except (KeyError, TypeError):  # not the shape of a JetStream error
            raise nats.js.errors.APIError(description=f"refused: {ack.error}") from None
    return api.PubAck(stream=ack.stream, seq=ack.seq, domain=ack.domain, duplicate=ack.duplicate)


def _as_broker_error(outcome: BaseException | api.PubAck, subject: str) -> BrokerError:
    if isinstance(outcome, asyncio.CancelledError):
        raise outcome
    assert isinstance(outcome, BaseException)
    return translate(outcome, subject=subject)
