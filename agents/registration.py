"""Registering an agent: one live process per id, a rate-limited slot, a card with a new epoch."""

from __future__ import annotations

import asyncio
import os
import random
import socket

import msgspec
import nats.errors
import nats.js.errors
import structlog
from agentreach.agents.liveness import AgentIdInUse
from agentreach.broker import Broker
from agentreach.broker.errors import translate
from agentreach.broker.lifecycle import now_ms
from agentreach.envelopes import AgentCard, RegisterReply, RegisterRequest

from agentreach import envelopes

log = structlog.get_logger("agents.registration")

_card_decoder = msgspec.json.Decoder(AgentCard)
_reply_decoder = msgspec.json.Decoder(RegisterReply)
SLOT_TIMEOUT_S = 2.0
MAX_RETRY_S = 10.0


async def await_slot(broker: Broker, agent_id: str) -> float | None:
    """Ask the coordinators for a registration slot until one is given.

    Returns the heartbeat interval the coordinator asks for, if any. With no
    coordinator running at all, the agent registers on its own (and says so).
    """
    request = envelopes.encode(RegisterRequest(agent_id=agent_id))
    waited = 0
    while True:
        try:
            answer = await broker.nc.request(broker.names.register, request, timeout=SLOT_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            log.warning("no coordinator answered the registration; registering directly")
            return None
        except nats.errors.TimeoutError:
            answer = None
        reply = _reply_decoder.decode(answer.data) if answer is not None else None
        if reply is not None and reply.ok:
            return reply.heartbeat_interval_s
        waited += 1
        base = reply.retry_after_ms / 1000 if reply else min(MAX_RETRY_S, 0.5 * 2**waited)
        delay = base * random.uniform(1.0, 1.5)  # jitter: a refused crowd must not return at once
        log.info("registration deferred, retrying", retry_in_s=round(delay, 3), tries=waited)
        await asyncio.sleep(delay)


async def write_card(broker: Broker, card: AgentCard) -> AgentCard:
    """Write ``card`` with the next epoch, reusing the agent's record.

    The write is conditional on the record read, so two processes registering
    the same id at once cannot both succeed.
    """
    kv = await broker.kv(broker.names.agents_bucket)
    revision = None
    epoch = 1
    try:
        entry = await kv.get(card.agent_id)
        revision = entry.revision
        epoch = _card_decoder.decode(entry.value or b"").epoch + 1
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        pass
    except msgspec.DecodeError:
        log.warning("replacing an unreadable agent card", agent_id=card.agent_id)
    except nats.errors.Error as exc:
        raise translate(exc) from exc
    card = msgspec.structs.replace(
        card, epoch=epoch, host=socket.gethostname(), pid=os.getpid(), started_at=now_ms()
    )
    data = envelopes.encode(card)
    try:
        if revision is None:
            await kv.create(card.agent_id, data)
        else:
            await kv.update(card.agent_id, data, last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise AgentIdInUse(
            f"agent_id {card.agent_id!r} was registered by another process at the same moment"
        ) from None
    except nats.errors.Error as exc:
        raise translate(exc) from exc
    return card
