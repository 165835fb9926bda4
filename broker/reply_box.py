"""A caller's reply box: the answers to one task, kept only when they come from whom they
should.

Each reply arrives on ``<box>.<sender>``; the sender token is unforgeable under
permissions. The coordinator (``_coordinator``) announces which agent has each attempt
with a ``routed`` notice, and may answer itself (a rejection, a stored result); an
agent's reply counts only when that agent has the attempt and its body says it is that
agent. Anything else is dropped (and logged), so a forged result never reaches the caller.
"""

from __future__ import annotations

import asyncio

from agentreach import envelopes
from agentreach.broker.messages import Inbound
from agentreach.broker.names import COORDINATOR, Names
from agentreach.envelopes import Reply, Routed
from agentreach.envelopes.server_answers import NO_HEADERS
from agentreach.logs import get_logger

log = get_logger("broker.reply_box")


class ReplyBox:
    """Collects verified replies to one task into ``replies`` (None: the client closed)."""

    def __init__(self, names: Names, caller: str, box: str) -> None:
        self.subject = names.reply_box(caller, box)
        self.replies: asyncio.Queue[Reply | None] = asyncio.Queue()
        self._routed: dict[int, str] = {}  # attempt → the agent that has it
        self._early: list[tuple[str, Reply]] = []  # agent replies before their notice

    @property
    def wildcard(self) -> str:
        return f"{self.subject}.*"

    def collect(self, msg: Inbound) -> None:
        sender = msg.subject.rsplit(".", 1)[-1]
        if not msg.headers:  # every party's reply has some: this is a server's answer
            log.warning("reply without headers dropped", sender=sender, why=NO_HEADERS)
            return
        try:
            reply = envelopes.decode_reply(msg.data)
        except envelopes.DecodeError:
            log.warning("unreadable reply dropped", sender=sender)
            return
        if sender == COORDINATOR:
            if isinstance(reply, Routed):
                self._routed[reply.attempt] = reply.agent_id
                self._release(reply.agent_id)
            else:
                self.replies.put_nowait(reply)
            return
        if reply.from_agent != sender:
            log.warning("reply claiming another sender dropped", sender=sender)
            return
        if self._routed.get(reply.attempt) == sender:
            self.replies.put_nowait(reply)
        else:
            self._early.append((sender, reply))

    def _release(self, agent_id: str) -> None:
        """Replies that came before the notice naming their agent count now."""
        kept = []
        for sender, reply in self._early:
            if sender == agent_id and self._routed.get(reply.attempt) == sender:
                self.replies.put_nowait(reply)
            else:
                kept.append((sender, reply))
        self._early = kept
