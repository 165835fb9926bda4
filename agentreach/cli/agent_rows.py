"""What the broker holds of the registered agents, one row each: card, verdict, last
heartbeat, breakers not closed and intents refused (``reach agents`` and ``reach agents
show``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentreach.broker import Broker, StreamNotFound
from agentreach.coordinator.routing import allowances
from agentreach.envelopes import AgentCard, BreakerRecord, Heartbeat, Liveness


@dataclass(frozen=True, slots=True)
class Row:
    key: str  # the card's key in the registry: the agent id
    card: AgentCard
    liveness: Liveness | None
    heartbeat: Heartbeat | None
    beat_age_s: float | None
    breakers: tuple[BreakerRecord, ...] = ()  # not closed: open or half-open
    refused: tuple[tuple[str, str], ...] = ()  # intents not allowed to it, and why

    @property
    def isolated(self) -> bool:
        return any(not b.intent for b in self.breakers)


async def collect(broker: Broker, *, allowances_enforced: bool = True) -> list[Row]:
    """One row per registered agent, sorted by id; with the intents refused to each when
    ``allowances_enforced``."""
    names = broker.names
    cards = await (await broker.bucket(names.agents_bucket, AgentCard)).snapshot()
    judged = await (await broker.bucket(names.liveness_bucket, Liveness)).snapshot()
    beats = await (await broker.bucket(names.heartbeats_bucket, Heartbeat)).snapshot()
    tripped = await _not_closed(broker)
    allowed = await _allowances(broker) if allowances_enforced else None
    rows = []
    for agent_id in sorted(cards):
        beat = beats.get(agent_id)
        age = time.time() - beat.written_ms / 1000 if beat and beat.written_ms else None
        liveness = judged[agent_id].value if agent_id in judged else None
        open_ones = tuple(tripped.get(agent_id, []))
        heartbeat = beat.value if beat else None
        card = cards[agent_id].value
        refused: tuple[tuple[str, str], ...] = ()
        if allowed is not None and card.agent_id == agent_id:
            refused = tuple(sorted(allowances.refused(card, allowed.get(agent_id)).items()))
        rows.append(Row(agent_id, card, liveness, heartbeat, age, open_ones, refused))
    return rows


async def _allowances(broker: Broker) -> dict[str, allowances.Allowance] | None:
    """What operators allowed each agent to serve, or None where nobody set allowances (an
    open server: the coordinator routes every intent a card names)."""
    try:
        bucket = await broker.bucket(allowances.bucket_name(broker.names), allowances.Allowance)
    except StreamNotFound:
        return None
    # An agent id is one subject token; the senders' ``priorities.<name>`` beside them are two.
    return {key: entry.value for key, entry in (await bucket.matching("*")).items()}


async def refused_to(broker: Broker, card: AgentCard) -> tuple[tuple[str, str], ...]:
    """The intents ``card`` names that operators did not allow its agent, and why."""
    allowed = await _allowances(broker)
    if allowed is None:
        return ()
    return tuple(sorted(allowances.refused(card, allowed.get(card.agent_id)).items()))


def breaker_shown(breaker: BreakerRecord, now_ms: int) -> str:
    """``intent:state`` (``ISOLATED:…`` for an isolation). An open breaker whose open time
    has passed stays open until a call comes to be its trial: said, or it reads as stuck."""
    state = breaker.state
    if state == "open" and now_ms >= breaker.open_until_ms:
        state = "open(trial due)"
    return f"{breaker.intent or 'ISOLATED'}:{state}"


async def tripped(broker: Broker, agent_id: str) -> list[BreakerRecord]:
    """The agent's breakers that are not closed (an isolation has no intent)."""
    return (await _not_closed(broker)).get(agent_id, [])


async def _not_closed(broker: Broker) -> dict[str, list[BreakerRecord]]:
    """Each agent's breakers that are open or half-open, by intent (isolation first)."""
    breakers = await (await broker.bucket(broker.names.breakers_bucket, BreakerRecord)).snapshot()
    tripped: dict[str, list[BreakerRecord]] = {}
    for stored in breakers.values():
        if stored.value.state != "closed":
            tripped.setdefault(stored.value.agent_id, []).append(stored.value)
    return {agent: sorted(found, key=lambda r: r.intent) for agent, found in tripped.items()}


def state_of(row: Row) -> str:
    # A stopped card is STOPPED whatever its last verdict, as in `reach top` and the metrics;
    # a draining one (stopping, its running handlers finishing) DRAINING, unless its process
    # died during the drain (judged OFFLINE since): it would read DRAINING for ever.
    judged = row.liveness
    if row.card.status == "draining" and judged and judged.state == "OFFLINE":
        return "OFFLINE" if judged.epoch >= row.card.epoch else "DRAINING"
    if row.card.status != "running":
        return row.card.status.upper()
    return judged.state if judged else "UNKNOWN"


def load_of(row: Row, state: str) -> tuple[int, int] | None:
    """Handlers running and slots, from its last heartbeat; None for an agent gone (what its
    last heartbeat said is not its load)."""
    beat = row.heartbeat
    if beat is None or state in ("OFFLINE", "STOPPED"):
        return None
    return beat.in_flight, beat.in_flight + beat.free_slots


def as_json(row: Row) -> dict[str, object]:
    """What the table shows of an agent, for scripts (``reach agents --json``)."""
    state, judged = state_of(row), row.liveness
    load = load_of(row, state)
    return {
        "agent_id": row.key,
        "state": state,
        "reason": judged.reason if judged else None,
        "since_ms": judged.since_ms if judged else None,
        "quarantined": bool(judged and judged.quarantined),
        "beat_age_s": round(row.beat_age_s, 1) if row.beat_age_s is not None else None,
        "in_flight": load[0] if load else None,
        "slots": load[1] if load else None,
        "intents": {topic: intent.version for topic, intent in sorted(row.card.intents.items())},
        "tags": dict(sorted(row.card.tags.items())),
        "breakers": [{"intent": b.intent or None, "state": b.state} for b in row.breakers],
        "refused": dict(row.refused),
        "card_names_another": row.card.agent_id if row.card.agent_id != row.key else None,
    }
