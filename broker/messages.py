"""Messages as the rest of Agent-Reach sees them: no nats-py type crosses this boundary.

A :class:`Delivery` is a JetStream message handed out by a consumer, to be
settled (ack, nak with a delay, term) or kept alive (in progress). An
:class:`Inbound` is a core NATS message on a subscription, which may be answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as _NatsSubscription

from agentreach.broker.errors import translated

_NO_HEADERS: MappingProxyType[str, str] = MappingProxyType({})


class Delivery:
    """One delivery of a stored message by a consumer; settle it exactly once."""

    __slots__ = ("_msg",)

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> MappingProxyType[str, str] | dict[str, str]:
        return self._msg.headers or _NO_HEADERS

    @property
    def stream(self) -> str:
        return self._msg.metadata.stream

    @property
    def stream_seq(self) -> int:
        return self._msg.metadata.sequence.stream

    @property
    def num_delivered(self) -> int:
        """1 on the first delivery, then +1 for each redelivery."""
        return self._msg.metadata.num_delivered or 1

    @property
    def pending(self) -> int:
        """Messages left for the consumer after this one."""
        return self._msg.metadata.num_pending or 0

    @property
    def timestamp_ns(self) -> int:
        """The broker's time of storing the message (its clock, not the sender's)."""
        stamp = self._msg.metadata.timestamp
        return int(stamp.timestamp() * 1e9) if stamp else 0

    @property
    def timestamp_ms(self) -> int:
        return self.timestamp_ns // 1_000_000

    async def ack(self) -> None:
        with translated(subject=self.subject):
            await self._msg.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        """Give the message back, to be redelivered after ``delay_s`` (at once when None)."""
        with translated(subject=self.subject):
            await self._msg.nak(delay=delay_s)

    async def term(self) -> None:
        """Never deliver this message again."""
        with translated(subject=self.subject):
            await self._msg.term()

    async def in_progress(self) -> None:
        """Still being worked on: restart the ack wait."""
        with translated(subject=self.subject):
            await self._msg.in_progress()


class Inbound:
    """A core NATS message; ``respond`` answers its reply subject."""

    __slots__ = ("_msg",)

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> MappingProxyType[str, str] | dict[str, str]:
        return self._msg.headers or _NO_HEADERS

    @property
    def reply(self) -> str:
        return self._msg.reply

    async def respond(self, data: bytes) -> None:
        with translated(subject=self._msg.reply):
            await self._msg.respond(data)


InboundHandler = Callable[[Inbound], Awaitable[None]]


class Subscription:
    """A live core subscription; ``close`` (or ``async with``) ends it."""

    __slots__ = ("_sub",)

    def __init__(self, sub: _NatsSubscription) -> None:
        self._sub = sub

    async def next(self, timeout_s: float) -> Inbound:
        """The next message (for subscriptions made without a handler)."""
        with translated(subject=self._sub.subject):
            return Inbound(await self._sub.next_msg(timeout=timeout_s))

    async def close(self) -> None:
        """Unsubscribe; safe to call twice, and on a closed connection."""
        with contextlib.suppress(Exception):  # already gone with its connection
            await self._sub.unsubscribe()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
