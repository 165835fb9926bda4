"""Messages as the rest of Agent-Reach sees them: no nats-py type crosses this boundary.

A :class:`Delivery` is a JetStream message handed out by a consumer, to be
settled (ack, nak with a delay, term) or kept alive (in progress). An
:class:`Inbound` is a core NATS message on a subscription, which may be answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as _NatsSubscription

from agentreach.broker.errors import BrokerError, translated
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes.server_answers import server_answer
from agentreach.logs import get_logger

log = get_logger("broker.messages")

_NO_HEADERS: MappingProxyType[str, str] = MappingProxyType({})
_V1_TOKENS, _V2_TOKENS = 9, 11


@dataclass(frozen=True, slots=True)
class Position:
    """Where a delivered message stands: its stream, consumer, stream sequence, the broker's
    time of storing it, how often it was delivered and how many messages follow it."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    timestamp_ns: int
    pending: int


def position_of(msg: Msg) -> Position:
    """A JetStream message's position, read from its reply subject without nats-py's
    ``Msg.metadata``, which builds a datetime and two dataclasses per message: a tenth of
    the coordinator's CPU when it watches the heartbeats of 100,000 agents, and 5 % of it
    per task.

    Raises nats-py's NotJSMessageError for a message not delivered by a consumer.
    """
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>, or with a
    # domain and an account hash after ACK (and a token more at the end).
    tokens = (msg.reply or "").split(".")
    at = 2 if len(tokens) == _V1_TOKENS else 4
    if tokens[:2] != ["$JS", "ACK"] or (at == 4 and len(tokens) < _V2_TOKENS):
        meta = msg.metadata  # raises, as nats-py does
        stamp = meta.timestamp
        return Position(
            stream=meta.stream,
            consumer=meta.consumer,
            delivered=meta.num_delivered or 1,
            stream_seq=meta.sequence.stream,
            timestamp_ns=int(stamp.timestamp() * 1e9) if stamp else 0,
            pending=meta.num_pending or 0,
        )
    return Position(
        stream=tokens[at],
        consumer=tokens[at + 1],
        delivered=int(tokens[at + 2]) or 1,
        stream_seq=int(tokens[at + 3]),
        timestamp_ns=int(tokens[at + 5]),
        pending=int(tokens[at + 6]),
    )


class Delivery:
    """One delivery of a stored message by a consumer; settle it exactly once."""

    __slots__ = ("_applied", "_msg", "_position")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self._position: Position | None = None
        self._applied = False  # acknowledged, and the server said it applied that

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
    def position(self) -> Position:
        if self._position is None:
            self._position = position_of(self._msg)
        return self._position

    @property
    def stream(self) -> str:
        return self.position.stream

    @property
    def stream_seq(self) -> int:
        return self.position.stream_seq

    @property
    def num_delivered(self) -> int:
        """1 on the first delivery, then +1 for each redelivery."""
        return self.position.delivered

    @property
    def pending(self) -> int:
        """Messages left for the consumer after this one."""
        return self.position.pending

    @property
    def timestamp_ns(self) -> int:
        """The broker's time of storing the message (its clock, not the sender's)."""
        return self.position.timestamp_ns

    @property
    def timestamp_ms(self) -> int:
        return self.timestamp_ns // 1_000_000

    async def ack(self) -> None:
        if self._applied:
            return
        with translated(subject=self.subject):
            await self._msg.ack()

    async def ack_applied(self, timeout_s: float = 5.0) -> None:
        """Acknowledge, and return once the server has applied it (a work queue's message
        is then gone): an acknowledgement is sent and forgotten, and a server that dies
        before it applies one delivers the message again, as new. A settle after this one
        does nothing."""
        with translated(subject=self.subject):
            await self._msg.ack_sync(timeout=timeout_s)
        self._applied = True

    async def nak(self, delay_s: float | None = None) -> None:
        """Give the message back, to be redelivered after ``delay_s`` (at once when None)."""
        if self._applied:
            return
        with translated(subject=self.subject):
            await self._msg.nak(delay=delay_s)

    async def term(self) -> None:
        """Never deliver this message again."""
        if self._applied:
            return
        with translated(subject=self.subject):
            await self._msg.term()

    async def in_progress(self) -> None:
        """Still being worked on: restart the ack wait."""
        if self._applied:
            return
        with translated(subject=self.subject):
            await self._msg.in_progress()

    @contextlib.asynccontextmanager
    async def kept_alive(self, every_s: float) -> AsyncIterator[None]:
        """While the block runs, say :meth:`in_progress` every ``every_s`` (at least 0.1 s),
        so that work longer than the ack wait is not delivered again meanwhile."""
        keeper = _KeepAlive(self, max(0.1, every_s))
        try:
            yield
        finally:
            await keeper.stop()


class _KeepAlive:
    """The timer of :meth:`Delivery.kept_alive`: a timer, not a task per block, since most
    blocks (a task's run) end long before it fires; one report that fails is left for the
    next."""

    def __init__(self, delivery: Delivery, every_s: float) -> None:
        self._delivery, self._every_s = delivery, every_s
        self._loop = asyncio.get_running_loop()
        self._saying: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(every_s, self._tick)

    def _tick(self) -> None:
        if self._saying is None or self._saying.done():
            self._saying = self._loop.create_task(self._say())
        self._timer = self._loop.call_later(self._every_s, self._tick)

    async def _say(self) -> None:
        with contextlib.suppress(BrokerError):
            await self._delivery.in_progress()

    async def stop(self) -> None:
        self._timer.cancel()
        if self._saying is not None:
            await cancel_and_wait(self._saying)


_logged_deliveries: set[str] = set()


def pushed_from_a_stream(msg: Msg) -> bool:
    """Whether ``msg`` is a stream's delivery (its reply is an ack subject) on a core
    subject: what a push consumer whose deliver subject someone chose makes the server send
    there, in its own name, past the permissions that forbid that party to publish there
    (nats-server checks no permission on a deliver subject). No request, reply or event of
    the protocol comes so; it is dropped, and said once per subject."""
    if not (msg.reply or "").startswith("$JS.ACK."):
        return False
    if msg.subject not in _logged_deliveries and len(_logged_deliveries) < 1000:
        _logged_deliveries.add(msg.subject)
        log.warning(
            "a stream's delivery on a core subject dropped (a push consumer made to deliver here)",
            subject=msg.subject,
            stream_and_consumer=".".join(msg.reply.split(".")[2:4]),
        )
    return True


# Subjects a request came on whose reply subject was refused, said once each (bounded by
# the subjects this process answers on, which are few).
_REFUSED_ON: set[str] = set()


def answered_by_the_server(msg: Msg) -> bool:
    """Whether ``msg`` is the NATS server's answer to someone's request, aimed at a core
    subject (see :mod:`agentreach.envelopes.server_answers`): a direct get's answer is a
    stored message of its requester's choosing (an agent's interval, a reload asked of every
    coordinator, in nobody's name). Dropped, and said once per subject."""
    if not msg.data and not msg.headers:  # a request with no body (a stream keeps a status so)
        return False
    if (said := server_answer(msg.data, msg.headers)) is None:
        return False
    if msg.subject not in _logged_answers and len(_logged_answers) < 1000:
        _logged_answers.add(msg.subject)
        log.warning(
            "a server's answer aimed at a core subject dropped", subject=msg.subject, what=said
        )
    return True


_logged_answers: set[str] = set()


def core_callback(handler: InboundHandler) -> Callable[[Msg], Awaitable[None]]:
    """nats-py's callback for a core subscription whose ``handler`` takes an Inbound."""

    async def callback(msg: Msg) -> None:
        if not pushed_from_a_stream(msg) and not answered_by_the_server(msg):
            await handler(Inbound(msg))

    return callback


def is_inbox(subject: str) -> bool:
    """Whether ``subject`` is a requester's inbox, ``_INBOX.…`` or a party's own
    ``_INBOX_<name>.…``: the only subjects an answer goes to. The reply subject is the
    requester's to choose, and NATS checks it against the answerer's permissions, not the
    requester's: the coordinator's answer to a request whose reply subject was
    ``$KV.reach_agents.<agent>`` was its own write over that agent's card."""
    head = subject.partition(".")[0]
    return head == "_INBOX" or head.startswith("_INBOX_")


class Inbound:
    """A core NATS message; ``respond`` answers its reply subject, when it is an inbox."""

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

    @property
    def answerable(self) -> bool:
        """Whether the request may be answered: its reply subject is an inbox
        (:func:`is_inbox`). One that is not is said once per subject asked, with the
        subject it named."""
        if is_inbox(self._msg.reply):
            return True
        if self._msg.subject not in _REFUSED_ON:
            _REFUSED_ON.add(self._msg.subject)
            log.warning(
                "request not answered: its reply subject is not an inbox (_INBOX.… or"
                " _INBOX_<name>.…)",
                subject=self._msg.subject,
                reply=self._msg.reply,
            )
        return False

    async def respond(self, data: bytes) -> None:
        """Answer on the reply subject; nothing is sent when it is not an inbox."""
        if not self.answerable:
            return
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
