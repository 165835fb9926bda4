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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from agentreach.broker import BucketSpec, Names, Topology
from agentreach.broker.replication import AUTO
from agentreach.envelopes import AgentCard

ANY = "*"
_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}\*?|\*")


class Allowance(msgspec.Struct, frozen=True, kw_only=True):
    """``<prefix>_allowances/<agent_id>``: the intents that agent may serve."""

    v: Literal[1] = 1
    agent_id: str
    intents: tuple[str, ...] = ()
    set_at: int = 0  # ms since epoch, informational


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
    why = f"not allowed by its credentials (it may serve: {shown(allowance.intents)})"
    return {intent: why for intent in card.intents if not allows(allowance.intents, intent)}


def believed(card: AgentCard, refusals: Mapping[str, str]) -> AgentCard:
    """``card`` without its refused intents: what routing sees."""
    if not refusals:
        return card
    kept = {name: spec for name, spec in card.intents.items() if name not in refusals}
    return msgspec.structs.replace(card, intents=kept)
