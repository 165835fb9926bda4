"""Presence and ping: how a coordinator tells a live agent process from a gone one.

The agent answers ``reach.presence.<id>`` with a plain subscription: when its
process is gone, the server answers "no responders" at once. ``reach.ping.<id>``
is a NATS micro service endpoint (service ``reach-agent``, so ``nats micro ls``
lists live agents), answered from the agent's event loop: silence there with a
live connection means the agent is stuck.

Probes ask for their answers under ``_INBOX_probe.<asker>.`` (:class:`ProbeInbox`), where
an agent may publish: on a secured server an agent has no response permission.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.micro
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agentreach.broker.connection import Broker
from agentreach.broker.errors import BrokerTimeout, NoResponders, translated
from agentreach.broker.messages import is_inbox
from agentreach.broker.names import probe_replies
from agentreach.broker.reply_inbox import ReplyInbox
from agentreach.logs import get_logger

log = get_logger("broker.presence")

SERVICE_NAME = "reach-agent"


class ProbeInbox(ReplyInbox):
    """The connection's subscription for the answers to its probes: under the probes' reply
    prefix (``_INBOX_probe.<asker>.<random>.``), with random tokens, since a probed agent
    sees the reply subject of its own probe and must not be able to guess another's (its
    "here" would keep a gone agent looking alive)."""

    def _new_prefix(self) -> str:
        return probe_inbox(self._broker) + "."

    def _new_token(self) -> str:
        return secrets.token_hex(8)


def probe_inbox(broker: Broker) -> str:
    """A new reply subject prefix for this connection's probes (``_INBOX_probe.<asker>.<random>``),
    the asker being the connection's user on a secured server."""
    asker = broker.auth.identity or "anyone"
    return f"{probe_replies(asker)}.{secrets.token_hex(8)}"


async def ask(broker: Broker, subject: str, timeout_s: float) -> None:
    """One probe of ``subject``: returns once answered; raises :class:`NoResponders` when
    nobody subscribes, :class:`BrokerTimeout` when nobody answers in time."""
    with translated(subject=subject):
        await broker.shared(ProbeInbox).ask(subject, b"", timeout_s=timeout_s)


class Presence:
    """The agent's side: answers presence and ping while the process lives."""

    def __init__(self, broker: Broker, agent_id: str, *, version: str, tags: dict[str, str]):
        self._broker = broker
        self._agent_id = agent_id
        self._version = version
        self._tags = tags
        self._sub: Subscription | None = None
        self._service: Any = None

    async def someone_else_answers(self, timeout_s: float) -> bool:
        """Whether another live process answers for this agent id already.

        Only an answer counts: a subscriber that answers nothing (``nats sub '>'``, or a
        process whose loop is stuck) must not keep the agent from starting; the new
        process's higher epoch fences a stuck one's late results.
        """
        subject = self._broker.names.presence(self._agent_id)
        try:
            await ask(self._broker, subject, timeout_s)
        except NoResponders:
            return False
        except BrokerTimeout:
            log.warning(
                "a subscriber on the presence subject did not answer; starting anyway",
                subject=subject,
            )
            return False
        return True

    async def start(self) -> None:
        nc = self._broker.nc
        names = self._broker.names
        with translated(subject=names.presence(self._agent_id)):
            self._sub = await nc.subscribe(names.presence(self._agent_id), cb=_answer)
            self._service = await nats.micro.add_service(
                nc,
                name=SERVICE_NAME,
                version=self._version,
                description=f"Agent-Reach agent {self._agent_id}",
                metadata={**self._tags, "agent_id": self._agent_id},  # the id wins over a tag
            )
            await self._service.add_endpoint(
                name="ping", subject=names.ping(self._agent_id), handler=_pong
            )

    async def stop(self) -> None:
        """Stop answering; safe to call twice."""
        service, self._service = self._service, None
        sub, self._sub = self._sub, None
        if service is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 2.0)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def _answer(msg: Msg) -> None:
    if is_inbox(msg.reply):  # an answer elsewhere would be this agent's write there
        await msg.respond(b"here")


async def _pong(request: Any) -> None:
    if is_inbox(request._msg.reply):  # nats.micro's Request keeps its message private
        await request.respond(b"pong")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe found: is the agent's connection there, does its loop answer."""

    connected: bool
    answers: bool


async def present(broker: Broker, agent_id: str, *, timeout_s: float) -> bool | None:
    """Ask presence: True when it answers, False for "no responders" (the agent's connection
    is not there), None when nothing answered within ``timeout_s`` (the subscription exists:
    its owner is stuck, or a wildcard subscriber heard the request and answers nothing)."""
    try:
        await ask(broker, broker.names.presence(agent_id), timeout_s)
    except NoResponders:
        return False
    except BrokerTimeout:
        return None
    return True


async def probe(
    broker: Broker, agent_id: str, *, connection_s: float, ping_s: float
) -> ProbeResult:
    """Ask presence (within ``connection_s``), then ping (within ``ping_s``). Presence
    unanswered is answering nothing: its connection is there, its process stuck (a ping
    after it took 5 s more, while what was queued for the agent waited)."""
    match await present(broker, agent_id, timeout_s=connection_s):
        case False:
            return ProbeResult(connected=False, answers=False)
        case None:
            return ProbeResult(connected=True, answers=False)
    try:
        await ask(broker, broker.names.ping(agent_id), ping_s)
    except (NoResponders, BrokerTimeout):
        return ProbeResult(connected=True, answers=False)
    return ProbeResult(connected=True, answers=True)
