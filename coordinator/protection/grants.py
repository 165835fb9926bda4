"""Grants: the coordinator's proof, on each dispatch, that an attempt was given to one agent.

With a seal key shared by the coordinator replicas (``security.seal_key_file``, made by
``reach auth init``), every dispatch carries ``Reach-Grant``: an HMAC of the task's ids,
attempt, topic, priority, reply subject and caller, and the agent it went to. Every event
an agent sends about the task carries it back; the coordinator acts on an outcome (a
retry, a dead letter) only when the grant matches, so no agent can make it retry, redirect
or end a task it was not given. Without a key (an open development server, where everyone
is trusted) there are no grants and nothing is checked.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Literal

import msgspec
import structlog

from agentreach.broker import Broker, Delivery
from agentreach.broker.lifecycle import (
    COORDINATOR,
    UNROUTED_LOOK_AGAIN_S,
    UNROUTED_LOOKS,
    MessageEvents,
    agent_event,
    emit,
    events_of,
)
from agentreach.envelopes import (
    NO_CALLER,
    ErrorReply,
    Event,
    Execution,
    Reply,
    Result,
    Task,
    execution_key,
)
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.grants")

GRANT_LENGTH = 32


UNSEALED_ENV = "REACH_UNSEALED"  # "1": as `security.unsealed: true` (a test rig's)


class SecurityConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a secured deployment adds: the replicas' shared seal key (a file of hex).
    ``unsealed``: run on a secured server without it, knowingly (it refuses to, else)."""

    seal_key_file: str | None = None
    unsealed: bool = False


class Grants:
    """Signs and checks grants with the seal key (or does nothing without one)."""

    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @classmethod
    def from_config(cls, config: SecurityConfig) -> Grants:
        if config.seal_key_file is None:
            return cls(None)
        text = Path(config.seal_key_file).read_text().strip()
        return cls(bytes.fromhex(text))

    @property
    def key(self) -> bytes | None:
        return self._key

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def sign(self, task: Task, agent_id: str) -> str | None:
        """The grant for ``task`` (as dispatched) given to ``agent_id``; None without a key."""
        if self._key is None:
            return None
        parts = (
            task.message_id,
            str(task.attempt),
            agent_id,
            task.topic,
            task.priority,
            task.trace_id,
            task.reply_to or "",
            task.caller or "",
        )
        digest = hmac.new(self._key, "|".join(parts).encode(), hashlib.sha256).hexdigest()
        return digest[:GRANT_LENGTH]

    def seal(self, caller: str | None, message_id: str, attempt: int, agent_id: str) -> str | None:
        """The seal of ``agent_id``'s execution record of an attempt it was given (None
        without a key): it names no more than the record's key and attempt, so the record
        of every write of that run carries the same one."""
        if self._key is None:
            return None
        parts = ("execution", caller or NO_CALLER, message_id, str(attempt), agent_id)
        digest = hmac.new(self._key, "|".join(parts).encode(), hashlib.sha256).hexdigest()
        return digest[:GRANT_LENGTH]

    def sealed(self, record: Execution, key: str) -> bool:
        """Whether ``record``, stored under ``key``, is one the coordinator gave its agent the
        attempt for (always, without a key)."""
        expected = self.seal(record.caller, record.message_id, record.attempt, record.agent_id)
        if expected is None:
            return True
        if key != execution_key(record.caller, record.message_id, record.agent_id):
            return False  # a body that names another caller, message or agent than its key
        return isinstance(record.seal, str) and hmac.compare_digest(record.seal, expected)

    def holds(self, grant: object, task: Task, agent_id: str) -> bool:
        """Whether ``grant`` is the one given with ``task`` to ``agent_id`` (always, without
        a key)."""
        expected = self.sign(task, agent_id)
        if expected is None:
            return True
        return isinstance(grant, str) and hmac.compare_digest(grant, expected)


async def vouched_sender(broker: Broker, subject: str, event: Event) -> str | None:
    """The sender of ``event`` (its subject's last token) when the event names it as its
    agent; None, after an ``alert`` saying who tried, when it names another. The
    coordinator's own events name the agent they are about (``routed``) or none (a person's
    answer); permissions keep agents from sending as the coordinator."""
    sender = broker.names.sender_of(subject)
    if sender == COORDINATOR or event.agent_id == sender:
        return sender
    await impersonation(broker, sender, event, "the event names another agent")
    return None


async def routing_vouches(
    broker: Broker,
    msg: Delivery,
    event: Event,
    events: MessageEvents,
    *,
    looks: int = UNROUTED_LOOKS,
) -> bool | float:
    """True when the delivered ``event`` is authentic (its attempt was routed to its sender);
    while it is not, the seconds until it is looked at again (``routed`` may be a moment
    behind), and False, after an ``impersonation`` alert, at the last of ``looks``."""
    if events.vouch_for(msg.stream_seq):
        return True
    return await _unrouted(broker, msg, event, looks)


async def reply_vouched(broker: Broker, msg: Delivery, answer: Result | ErrorReply) -> bool | float:
    """True when the delivered ``answer`` (a workflow step's) comes from the coordinator or
    from the agent its attempt was routed to; while it does not, the seconds until it is
    looked at again (``routed`` may be a moment behind), and False, after an
    ``impersonation`` alert, at the last look."""
    sender = broker.names.sender_of(msg.subject)
    if sender == COORDINATOR:
        return True
    if isinstance(answer, ErrorReply):
        await impersonation(broker, sender, answer, "only the coordinator sends an error")
        return False
    if await step_routed_to(broker, answer, sender):
        return True
    return await _unrouted(broker, msg, answer, UNROUTED_LOOKS)


async def _unrouted(
    broker: Broker, msg: Delivery, claim: Event | Reply, looks: int
) -> float | Literal[False]:
    """Seconds until ``msg`` is looked at again while its ``routed`` may be a moment behind;
    False, after an ``impersonation`` alert, at the last of ``looks``."""
    if msg.num_delivered < looks:
        return UNROUTED_LOOK_AGAIN_S
    sender = broker.names.sender_of(msg.subject)
    # Said as what is known: on a server without grants a forged dispatch makes an honest
    # agent report on a task it was never routed, and the liar is whoever sent that.
    why = "the attempt was not routed to it (its report on another's task, or a dispatch"
    why += " the coordinator never sent)"
    await impersonation(broker, sender, claim, why)
    return False


async def step_routed_to(broker: Broker, answer: Result, sender: str) -> bool:
    """Whether the coordinator routed ``answer``'s attempt to ``sender`` as a task no caller
    sent (a workflow step): an agent's own task of the same message id, in a trace of its
    choosing, would name the agent as its caller."""
    names = broker.names
    events = await events_of(broker, answer.trace_id, answer.message_id)
    return any(
        names.sender_of(stored.subject) == COORDINATOR
        and event.event == "routed"
        and event.caller is None
        and event.agent_id == sender
        and event.attempt == answer.attempt
        for stored, event in events.authentic
    )


IMPERSONATIONS_SAID_PER_MINUTE = 3  # alerts (and log lines) per sender


class _Impersonations:
    """Which impersonations are said, per connection: a few a minute per sender. A sender
    forging events under new ids had 16,533 alerts (76 MB) and as many lines in 20 s, and
    slowed every caller; the rest are dropped unsaid, counted in the next."""

    def __init__(self, broker: Broker) -> None:
        self.said = RepeatedLines(60.0, burst=IMPERSONATIONS_SAID_PER_MINUTE)


async def impersonation(broker: Broker, sender: str, claim: Event | Reply, why: str) -> None:
    """An event or reply that is not what it claims: dropped, and an ``alert`` says who
    tried."""
    if (unsaid := broker.shared(_Impersonations).said.due(sender)) is None:
        return
    if isinstance(claim, Event):
        claimed, kind = claim.agent_id, claim.event
    else:
        claimed, kind = claim.from_agent, str(type(claim).__struct_config__.tag)
    log.warning("impersonation refused", sender=sender, claimed=claimed, why=why,
                more_not_said=unsaid)  # fmt: skip
    alert = agent_event(
        sender,
        "alert",
        problem="impersonation",
        why=why,
        claimed=claimed,
        kind=kind,
        message_id=claim.message_id,
        more_not_said=unsaid,
    )
    await emit(broker, alert)
