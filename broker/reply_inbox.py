"""One wildcard subscription for the answers to a connection's requests.

nats-py's request machinery (a future and an ``asyncio.wait_for`` per call) and a fresh
subscription per multi-message answer (a SUB and an UNSUB) both cost more than the request
itself on the hot path. Publish acks and direct gets take a token here instead, answer on
``<inbox>.<token>``, and are handed each message for their token as the connection reads it
(:mod:`agentreach.broker.immediate`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats.aio.msg
import nats.errors

from agentreach.broker.errors import translated
from agentreach.broker.immediate import Handler, subscribe_immediate

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

ReplyHandler = Handler


class ReplyInbox:
    """The connection's one reply subscription (``Broker.shared(ReplyInbox)``)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._prefix = ""
        self._opening = asyncio.Lock()
        self._sent = 0
        self._handlers: dict[str, ReplyHandler] = {}

    async def expect(self, handler: ReplyHandler) -> tuple[str, str]:
        """A new token and its reply subject; ``handler`` gets each message sent to it until
        :meth:`forget`."""
        if not self._prefix:
            await self._open()
        token = self._new_token()
        self._handlers[token] = handler
        return token, self._prefix + token

    def forget(self, token: str) -> None:
        self._handlers.pop(token, None)

    async def ask(self, subject: str, data: bytes, *, timeout_s: float) -> nats.aio.msg.Msg:
        """Publish ``data`` to ``subject`` and wait for its one answer; raises as nats-py's
        ``request`` does (``NoRespondersError`` when nobody listens, a ``TimeoutError``),
        without its timer task and fresh inbox per call."""
        answer: asyncio.Future[nats.aio.msg.Msg] = asyncio.get_running_loop().create_future()
        token, reply = await self.expect(lambda msg: answer.done() or answer.set_result(msg))
        try:
            nc = self._broker.nc
            if not nc.is_connected:  # on this ask's clock, not the client's
                await nc.connected_within(timeout_s)
            await nc.publish(subject, data, reply=reply)
            async with asyncio.timeout(timeout_s):
                msg = await answer
        finally:
            self.forget(token)
        if not msg.data and (msg.headers or {}).get("Status") == "503":
            raise nats.errors.NoRespondersError
        return msg

    async def _open(self) -> None:
        async with self._opening:  # two first requests at once make one subscription
            if self._prefix:
                return
            prefix = self._new_prefix()
            with translated(subject=prefix + "*"):
                await subscribe_immediate(self._broker.nc, prefix + "*", self._on_reply)
            self._prefix = prefix

    def _new_prefix(self) -> str:
        return self._broker.new_inbox() + "."

    def _new_token(self) -> str:
        self._sent += 1
        return str(self._sent)

    def _on_reply(self, msg: nats.aio.msg.Msg) -> None:
        handler = self._handlers.get(msg.subject[len(self._prefix) :])
        if handler is not None:  # else: answered late, after its asker gave up
            handler(msg)
