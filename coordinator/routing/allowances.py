"""Intent allowances: which intents an agent's credentials let it serve (routing believes
no more of a card).

An agent's card is its own claim: it may name any intent with any capacity. In a secured
deployment the operator decides instead, per agent name: ``reach auth agent NAME --intents
a,b`` (or ``reach auth allow NAME --intents a,b``) records it in the auth directory, and
``reach auth push`` writes it to KV ``<prefix>_allowances`` (key = agent_id), as the
directory's ``admin``. Only operators and the coordinator may write that bucket: an agent's
template lets it write its own card, heartbeat and execution records and nothing else, and a
caller or a worker no KV at all. The coordinator, run with its seal key, routes to an agent
only the intents its allowance names; the card's other intents are refused, the way a card
naming another agent is ignored.

Patterns: an intent's name, ``*`` for any, or ``prefix*`` for every intent that starts so.

The same bucket holds which priorities each sender may use (:class:`SenderPriorities`, under
``priorities.<name>``: a name is one subject token, never dotted, so no agent id is such a
key). ``reach auth caller NAME --priorities P1,P2`` or ``reach auth allow NAME --priorities
…`` records it, ``reach auth push`` writes it, and a coordinator with its seal key refuses at
intake a task whose sender (the last token of ``reach.task.<topic>.<sender>``) may not use its
priority (:mod:`agentreach.coordinator.routing.priorities`). A sender the bucket does not
name may use :data:`UNLISTED_PRIORITIES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from agentreach.broker import BucketSpec, Names, Topology
from agentreach.broker.replication import AUTO
from agentreach.envelopes import PRIORITIES, AgentCard, Priority

ANY = "*"
_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}\*?|\*")
PRIORITIES_KEY = "priorities."  # + a sender's name: that sender's SenderPriorities
# What a new caller may use, and a sender the bucket does not name (one issued since the last
# push): P0 is for the callers an operator chose, or it is no fast lane.
UNLISTED_PRIORITIES: tuple[Priority, ...] = ("P1", "P2")


class Allowance(msgspec.Struct, frozen=True, kw_only=True):
    """``<prefix>_allowances/<agent_id>``: the intents that agent may serve."""

    v: Literal[1] = 1
    agent_id: str
    intents: tuple[str, ...] = ()
    set_at: int = 0  # ms since epoch, informational
    revoked: bool = False  # `reach auth revoke`: its creds connect no more, it serves nothing


class SenderPriorities(msgspec.Struct, frozen=True, kw_only=True):
    """``<prefix>_allowances/priorities.<sender>``: the priorities that sender's tasks may
    have (a caller's; an agent's sub-tasks; a worker's replays)."""

    v: Literal[1] = 1
    sender: str
    priorities: tuple[Priority, ...] = ()
    set_at: int = 0  # ms since epoch, informational


def priorities_key(sender: str) -> str:
    return PRIORITIES_KEY + sender


def sender_of_key(key: str) -> str | None:
    """The sender whose priorities ``key`` holds, or None for an agent's intent allowance."""
    return key.removeprefix(PRIORITIES_KEY) if key.startswith(PRIORITIES_KEY) else None


def parse_priorities(text: str) -> tuple[Priority, ...]:
    """``"p1, P0"`` → ``("P0", "P1")``: at least one, any case, in order of urgency."""
    given = {p.strip().upper() for p in text.split(",") if p.strip()}
    unknown = sorted(given - set(PRIORITIES))
    if unknown:
        raise ValueError(f"priority {unknown[0]!r}: use P0, P1 or P2, comma-separated")
    if not given:
        raise ValueError("name at least one of P0, P1, P2 (to stop a party, revoke it)")
    return tuple(p for p in PRIORITIES if p in given)


def bucket_name(names: Names) -> str:
    return f"{names.prefix}_allowances"


def topology(names: Names) -> Topology:
    """The allowances bucket alone: made by ``reach auth push`` and by a coordinator that
    enforces allowances, whichever comes first."""
    spec = BucketSpec(
        name=bucket_name(names),
        history=5,
        description="Intents each agent may serve, by agent_id (written by operators)",
    )
    return Topology(streams=(), buckets=(spec,), replicas=AUTO)


def parse(text: str) -> tuple[str, ...]:
    """``"summarize, translate"`` → ``("summarize", "translate")``; ``""`` allows nothing."""
    patterns = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    for pattern in patterns:
        if not _PATTERN.fullmatch(pattern):
            raise ValueError(
                f"intent pattern {pattern!r}: an intent's name (letters, digits, '_', '-'),"
                " '*' for any, or 'prefix*'"
            )
    return patterns


def allows(patterns: Iterable[str], intent: str) -> bool:
    for pattern in patterns:
        if pattern in (intent, ANY):
            return True
        if pattern.endswith(ANY) and intent.startswith(pattern[:-1]):
            return True
    return False


def shown(patterns: Iterable[str]) -> str:
    return ",".join(patterns) or "nothing"


def refused(card: AgentCard, allowance: Allowance | None) -> dict[str, str]:
    """The intents of ``card`` the coordinator will not route to it, each with the reason."""
    if allowance is None or allowance.agent_id != card.agent_id:
        why = (
            f"no intent allowance for {card.agent_id} (an operator runs `reach auth allow"
            f" {card.agent_id} --intents …`, then `reach auth push`)"
        )
        return dict.fromkeys(card.intents, why)
    if allowance.revoked:
        why = f"{card.agent_id} is revoked (`reach auth revoke`): its creds no longer connect"
        return dict.fromkeys(card.intents, why)
    why = f"not allowed by its credentials (it may serve: {shown(allowance.intents)})"
    return {intent: why for intent in card.intents if not allows(allowance.intents, intent)}


def believed(card: AgentCard, refusals: Mapping[str, str]) -> AgentCard:
    """``card`` without its refused intents: what routing sees."""
    if not refusals:
        return card
    kept = {name: spec for name, spec in card.intents.items() if name not in refusals}
    return msgspec.structs.replace(card, intents=kept)
