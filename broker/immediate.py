"""Subscriptions whose messages are handed over the moment the connection reads them.

nats-py queues each message of a subscription made with a callback, and a task of the
subscription's own takes it from the queue and awaits the callback: a queue put, a task
wake-up and a coroutine per message, and one more turn of the event loop at every hop of
a task's path. The handlers of the busiest subscriptions only hand a message on (a publish
ack to its future, a delivery to its puller's queue), so that turn is all they cost.
:func:`subscribe_immediate` has nats-py put each message into a queue that keeps nothing
and calls a plain function at once, in the connection's read loop; nats-py's count of
pending bytes (its slow-consumer limit) stays at zero. The handler must be quick; one that
raises has the message dropped and logged, and the connection goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import nats.aio.client
import nats.aio.msg
import nats.aio.subscription

from agentreach.broker.errors import translated
from agentreach.broker.messages import (
    Inbound,
    Subscription,
    answered_by_the_server,
    pushed_from_a_stream,
)
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

log = get_logger("broker.immediate")

Handler = Callable[[nats.aio.msg.Msg], None]


class _HandOver(asyncio.Queue):  # type: ignore[type-arg]
    """What nats-py takes for the subscription's queue: each message goes to ``handler``,
    and none is ever kept (so ``next_msg`` and ``messages`` have nothing to give)."""

    def __init__(self, sub: nats.aio.subscription.Subscription, handler: Handler) -> None:
        super().__init__()
        self._sub = sub
        self._handler = handler

    async def get(self) -> nats.aio.msg.Msg:
        raise RuntimeError("an immediate subscription's messages go to its handler")

    def get_nowait(self) -> nats.aio.msg.Msg:
        raise RuntimeError("an immediate subscription's messages go to its handler")

    def put_nowait(self, item: nats.aio.msg.Msg) -> None:
        self._sub._pending_size = 0  # nothing waits here: it was handed over
        try:
            self._handler(item)
        except Exception:  # a bug in a handler must not end the connection's read loop
            log.exception("a message handler failed; the message is dropped", subject=item.subject)


async def subscribe_immediate(
    nc: nats.aio.client.Client, subject: str, handler: Handler
) -> nats.aio.subscription.Subscription:
    """Subscribe to ``subject``; ``handler`` gets each message as the connection reads it."""
    sub = await nc.subscribe(subject)  # without a callback nats-py starts no task for it
    hand_over = _HandOver(sub, handler)
    queued, sub._pending_queue = sub._pending_queue, hand_over
    while not queued.empty():  # what came while the subscription was being made
        hand_over.put_nowait(queued.get_nowait())
    return sub


async def listen(broker: Broker, subject: str, handler: Callable[[Inbound], None]) -> Subscription:
    """A core subscription of ``broker`` whose ``handler`` gets each message as it is read:
    for a handler that only sorts a message into a queue (a caller's reply box), with no
    task of its own and no turn of the event loop per message."""
    with translated(subject=subject):
        sub = await subscribe_immediate(
            broker.nc,
            subject,
            lambda msg: _unless_forged(msg, handler),
        )
    return Subscription(sub)


def _unless_forged(msg: nats.aio.msg.Msg, handler: Callable[[Inbound], None]) -> None:
    """Hand ``msg`` on unless the server sent it in someone's stead (see ``core_callback``)."""
    if not pushed_from_a_stream(msg) and not answered_by_the_server(msg):
        handler(Inbound(msg))
