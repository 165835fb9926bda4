"""Two agents whose descriptions overlap (refunds and fraud both speak of money taken), as in
the design's example, and a caller that collects every reply to its reply subject."""

from __future__ import annotations

import asyncio
from typing import Self

from agentreach import envelopes
from agentreach.agents import Agent
from agentreach.broker import Broker, Inbound, Subscription
from agentreach.examples.refunds import agents

SURE_REFUND = "The blender arrived broken, I want my money back"
SURE_RISK = "There is a charge on my card that I did not make"
UNSURE = "I see two charges for the same order, please refund the duplicate payment"
BARE = "blender"  # a word of one refund example, and all the request says


def overlapping_agents() -> tuple[Agent, Agent]:
    """customer-service serves refund_application, risk-control serves risk_review (fresh
    agents each time, from the example an operator runs)."""
    return agents()


class Caller:
    """Every reply arriving for one reply subject, by message id, awaited without sleeping:
    on the subject itself (an operator's inbox) or on ``<subject>.<sender>`` (a reply box)."""

    def __init__(self, broker: Broker, subject: str) -> None:
        self._broker = broker
        self.subject = subject
        self.replies: list[envelopes.Reply] = []
        self._arrived = asyncio.Condition()
        self._subs: list[Subscription] = []

    async def __aenter__(self) -> Self:
        for subject in (self.subject, f"{self.subject}.*"):
            self._subs.append(await self._broker.subscribe(subject, self._on_reply))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for sub in self._subs:
            await sub.close()

    async def _on_reply(self, msg: Inbound) -> None:
        self.replies.append(envelopes.decode_reply(msg.data))
        async with self._arrived:
            self._arrived.notify_all()

    async def reply(self, message_id: str, kind: str, timeout: float = 10.0) -> envelopes.Reply:
        """The first reply of ``kind`` (ack, progress, result, error) about ``message_id``."""

        def found() -> envelopes.Reply | None:
            for reply in self.replies:
                tag = type(reply).__struct_config__.tag
                if reply.message_id == message_id and tag == kind:
                    return reply
            return None

        async with asyncio.timeout(timeout), self._arrived:
            while (hit := found()) is None:
                await self._arrived.wait()
            return hit
