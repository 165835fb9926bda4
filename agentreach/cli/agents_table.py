"""``reach agents``: who is registered, how the coordinator judges them, and their load."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from agentreach.broker import Broker
from agentreach.broker.reader import read_bucket
from agentreach.coordinator.breaker import BreakerRecord
from agentreach.envelopes import AgentCard, Heartbeat, Liveness


@dataclass(frozen=True, slots=True)
class Row:
    card: AgentCard
    liveness: Liveness | None
    heartbeat: Heartbeat | None
    beat_age_s: float | None
    breakers: tuple[BreakerRecord, ...] = ()  # not closed: open or half-open

    @property
    def isolated(self) -> bool:
        return any(not b.intent for b in self.breakers)


async def collect(broker: Broker) -> list[Row]:
    """One row per registered agent, sorted by id."""
    names = broker.names
    cards = await read_bucket(await broker.kv(names.agents_bucket), AgentCard)
    judged = await read_bucket(await broker.kv(names.liveness_bucket), Liveness)
    beats = await read_bucket(await broker.kv(names.heartbeats_bucket), Heartbeat)
    breakers = await read_bucket(await broker.kv(names.breakers_bucket), BreakerRecord)
    tripped: dict[str, list[BreakerRecord]] = {}
    for stored in breakers.values():
        if stored.value.state != "closed":
            tripped.setdefault(stored.value.agent_id, []).append(stored.value)
    rows = []
    for agent_id in sorted(cards):
        beat = beats.get(agent_id)
        written = beat.written if beat else None
        age = time.time() - written.timestamp() if written else None
        liveness = judged[agent_id].value if agent_id in judged else None
        open_ones = tuple(sorted(tripped.get(agent_id, []), key=lambda r: r.intent))
        heartbeat = beat.value if beat else None
        rows.append(Row(cards[agent_id].value, liveness, heartbeat, age, open_ones))
    return rows


def render(rows: list[Row]) -> str:
    if not rows:
        return "no agents registered"
    header = (
        f"{'AGENT':<22} {'STATE':<9} {'SINCE':<9} {'BEAT':>6} {'LOAD':>7}  INTENTS  TAGS  BREAKERS"
    )
    isolated = sum(row.isolated for row in rows)
    footer = f"{len(rows)} agents, {isolated} isolated"
    return "\n".join([header, *(_line(row) for row in rows), footer])


def _line(row: Row) -> str:
    card, judged, beat = row.card, row.liveness, row.heartbeat
    state = judged.state if judged else ("UNKNOWN" if card.status == "running" else "STOPPED")
    if judged and judged.quarantined:
        state = "QUARANT."
    since = (
        dt.datetime.fromtimestamp(judged.since_ms / 1000).strftime("%H:%M:%S") if judged else "-"
    )
    age = f"{row.beat_age_s:.1f}s" if row.beat_age_s is not None else "-"
    load = f"{beat.in_flight}/{beat.in_flight + beat.free_slots}" if beat else "-"
    intents = ",".join(f"{t}@{i.version}" for t, i in sorted(card.intents.items()))
    tags = ",".join(f"{k}={v}" for k, v in sorted(card.tags.items())) or "-"
    breakers = ",".join(f"{b.intent or 'ISOLATED'}:{b.state}" for b in row.breakers) or "-"
    return (
        f"{card.agent_id:<22} {state:<9} {since:<9} {age:>6} {load:>7}"
        f"  {intents}  {tags}  {breakers}"
    )
