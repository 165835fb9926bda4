"""JetStream publishes in flight together: one ack subscription, one timer per batch.

nats-py's ``js.publish`` is a request: a fresh future, an ``asyncio.wait_for`` timer and a
JSON parse per message, and its caller waits for each ack before sending the next. A writer
of many independent messages (the coordinator's liveness verdicts and events) sends them all
here, then waits once; their acks arrive on one wildcard subscription of this connection.
The messages reach the server in the order given, so the stream stores them in that order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import nats.aio.msg
import nats.js.errors

from agentreach.broker.errors import BrokerError, BrokerTimeout, Unavailable, translate, translated

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker


class Outgoing(NamedTuple):
    """One message for a stream."""

    subject: str
    data: bytes
    headers: dict[str, str] | None = None


class _Ack(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    error: dict[str, object] | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


class PipelinedPublisher:
    """Publishes batches of messages and collects their acks; one per connection."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._prefix = ""
        self._sent = 0
        self._waiting: dict[str, asyncio.Future[BrokerError | None]] = {}

    async def publish_all(
        self, messages: Sequence[Outgoing], *, timeout_s: float
    ) -> list[BrokerError | None]:
        """Publish every message, then wait up to ``timeout_s`` for all their acks: for each,
        None when it is stored, or the error (a timeout, a stream without a leader, a refusal).

        A message that timed out may have been stored; one refused or unanswered was not.
        """
        if not messages:
            return []
        nc = self._broker.nc
        if not self._prefix:
            await self._subscribe()
        loop = asyncio.get_running_loop()
        pending: list[tuple[str, asyncio.Future[BrokerError | None]]] = []
        try:
            for message in messages:
                self._sent += 1
                token = str(self._sent)
                future: asyncio.Future[BrokerError | None] = loop.create_future()
                self._waiting[token] = future
                pending.append((token, future))
                with translated(subject=message.subject):
                    await nc.publish(
                        message.subject,
                        message.data,
                        reply=self._prefix + token,
                        headers=self._broker.sealed(message.headers),
                    )
            await asyncio.wait([future for _, future in pending], timeout=timeout_s)
            return [
                self._outcome(future, subject=message.subject)
                for (_, future), message in zip(pending, messages, strict=True)
            ]
        finally:
            for token, future in pending:
                self._waiting.pop(token, None)
                future.cancel()

    async def _subscribe(self) -> None:
        prefix = self._broker.new_inbox() + "."
        with translated(subject=prefix + "*"):
            await self._broker.nc.subscribe(prefix + "*", cb=self._on_ack)
        self._prefix = prefix

    async def _on_ack(self, msg: nats.aio.msg.Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if future is not None and not future.done():
            future.set_result(_answer(msg))

    @staticmethod
    def _outcome(future: asyncio.Future[BrokerError | None], *, subject: str) -> BrokerError | None:
        if future.done() and not future.cancelled():
            return future.result()
        return BrokerTimeout(f"no ack for a write on {subject!r}")


def _answer(msg: nats.aio.msg.Msg) -> BrokerError | None:
    """What a stream's answer says: None when stored."""
    if msg.headers and msg.headers.get("Status") == "503":
        return Unavailable(f"no stream answered on {msg.headers.get('Nats-Subject', '?')!r}")
    try:
        ack = _decode_ack(msg.data)
    except msgspec.DecodeError:
        return BrokerError(f"unreadable ack: {msg.data[:200]!r}")
    if ack.error is None:
        return None
    try:
        nats.js.errors.APIError.from_error(ack.error)  # raises the error's own class
    except nats.js.errors.APIError as exc:
        return translate(exc)
    return BrokerError(f"refused: {ack.error}")
