"""Registering an agent: one live process per id, a rate-limited slot, a card with a new epoch."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from typing import Literal

import msgspec

from agentreach import envelopes
from agentreach.agents.coordinator_presence import coordinator_runs
from agentreach.agents.errors import AgentConfigError, AgentIdInUse
from agentreach.broker import (
    Broker,
    BrokerTimeout,
    Contended,
    Entry,
    NoResponders,
    WrongLastSequence,
)
from agentreach.envelopes import AgentCard, RegisterReply, RegisterRequest, decode_as, now_ms
from agentreach.logs import get_logger

log = get_logger("agents.registration")

SLOT_TIMEOUT_S = 2.0
MAX_RETRY_S = 10.0


async def await_slot(broker: Broker, agent_id: str) -> float | None:
    """Ask the coordinators for a registration slot until one is given.

    Returns the heartbeat interval the coordinator asks for, if any. With no
    coordinator running at all (the server says nobody listens on ``reach.ctl.status``), the
    agent registers on its own (and says so). Nobody at the registrations' desk while a
    coordinator answers ``reach.ctl.status``, or while that goes unanswered, is a flooded
    desk, which does not listen for a few seconds: asked again later, as a deferral is.
    """
    request = envelopes.encode(RegisterRequest(agent_id=agent_id))
    waited = 0
    while True:
        try:
            subject = broker.names.register(agent_id)
            answer = await broker.request(subject, request, timeout=SLOT_TIMEOUT_S)
        except NoResponders:
            runs = await coordinator_runs(broker, timeout_s=SLOT_TIMEOUT_S, none_for_s=0)
            if runs is False:
                log.warning("no coordinator answered the registration; registering directly")
                return None
            # A status desk slow to answer (a flood queued before it on the desks'
            # connection, a loaded host) is no proof that nobody runs: asked again later.
            log.warning(
                "a coordinator runs but its registrations' desk does not listen now"
                if runs
                else "the registrations' desk does not listen and reach.ctl.status did not"
                " answer in time; asking again"
            )
            answer = None
        except BrokerTimeout:
            answer = None
        reply = decode_as(answer.data, RegisterReply) if answer is not None else None
        if reply is not None and reply.ok:
            return reply.heartbeat_interval_s
        if reply is not None and reply.error:
            raise AgentConfigError(f"the coordinator refused the registration: {reply.error}")
        waited += 1
        base = reply.retry_after_ms / 1000 if reply else min(MAX_RETRY_S, 0.5 * 2**waited)
        delay = base * random.uniform(1.0, 1.5)  # jitter: a refused crowd must not return at once
        log.info("registration deferred, retrying", retry_in_s=round(delay, 3), tries=waited)
        await asyncio.sleep(delay)


async def write_card(broker: Broker, card: AgentCard) -> Entry[AgentCard]:
    """Write ``card`` with the next epoch, reusing the agent's record; returns it with the
    revision it was written at.

    The write is conditional on the record read, so two processes registering
    the same id at once cannot both succeed.
    """
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    stamped = msgspec.structs.replace(
        card, host=socket.gethostname(), pid=os.getpid(), started_at=now_ms()
    )

    there = await cards.last(card.agent_id)
    # A card none can read (a server's answer a caller aimed at it), or deleted: the entry's
    # revision is past every epoch written before it, each at a revision of its own. From 1,
    # the new process lost to a stalled older one, which fenced it off when it woke, and
    # waited out a crashed one's claims (a lower epoch takes over none).
    unread = there.revision if there is not None else await cards.deleted_at(card.agent_id) or 1

    def next_epoch(previous: AgentCard | None) -> AgentCard:
        return msgspec.structs.replace(stamped, epoch=previous.epoch + 1 if previous else unread)

    try:
        swap = await cards.cas(card.agent_id, next_epoch, tries=1, known=there)
    except WrongLastSequence:
        raise AgentIdInUse(
            f"agent_id {card.agent_id!r} was registered by another process at the same moment"
        ) from None
    assert swap.entry is not None
    return swap.entry


async def restore_card(broker: Broker, card: AgentCard) -> Entry[AgentCard] | None:
    """Write ``card`` again when the registry has no readable card of the agent (a server
    that came back with an empty store, a card deleted or overwritten by hand); returns it
    as written, or None when one was there. Raises BrokerError while the registry is not
    there (not provisioned again yet)."""
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    try:  # a readable card stands (a new process of the agent may have written it)
        swap = await cards.cas(
            card.agent_id, lambda there: card if there is None else None, tries=1
        )
    except Contended:
        return None  # written meanwhile: that one stands
    if not swap.written or swap.entry is None:
        return None
    log.warning(
        "the registry had no readable card of this agent (lost, deleted or overwritten);"
        " written again",
        agent_id=card.agent_id,
    )
    return swap.entry


async def mark_card(
    broker: Broker, registered: Entry[AgentCard], status: Literal["draining", "stopped"]
) -> Entry[AgentCard] | None:
    """The card rewritten with ``status`` at the revision this process last wrote it, or None
    when a newer process of the id has registered since (its card stands)."""
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    marked = msgspec.structs.replace(registered.value, status=status)
    try:
        revision = await cards.update(registered.key, marked, last=registered.revision)
    except WrongLastSequence:
        log.warning("a newer process registered this agent id; its card stands")
        return None
    return Entry(registered.key, marked, revision)
