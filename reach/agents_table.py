"""``reach agents``: who is registered, how the coordinator judges them, and their load."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from broker import Broker
from coordinator.breaker import BreakerRecord
from envelopes import AgentCard, Heartbeat, Liveness

T = TypeVar("T")


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
    cards = await _all(await broker.kv(names.agents_bucket), AgentCard)
    judged = await _all(await broker.kv(names.liveness_bucket), Liveness)
    beats = await _all(await broker.kv(names.heartbeats_bucket), Heartbeat)
    breakers = await _all(await broker.kv(names.breakers_bucket), BreakerRecord)
    tripped: dict[str, list[BreakerRecord]] = {}
    for record, _ in breakers.values():
        if record.state != "closed":
            tripped.setdefault(record.agent_id, []).append(record)
    rows = []
    for agent_id in sorted(cards):
        card, _ = cards[agent_id]
        beat, beat_at = beats.get(agent_id, (None, None))
        age = time.time() - beat_at.timestamp() if beat_at else None
        open_ones = tuple(sorted(tripped.get(agent_id, []), key=lambda r: r.intent))
        rows.append(Row(card, judged.get(agent_id, (None, None))[0], beat, age, open_ones))
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


async def _all(kv: KeyValue, kind: type[T]) -> dict[str, tuple[T, dt.datetime | None]]:
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return {}
    found: dict[str, tuple[T, dt.datetime | None]] = {}
    for key in keys:
        try:
            entry = await kv.get(key)
            found[key] = (msgspec.json.decode(entry.value or b"", type=kind), entry.created)
        except (nats.errors.Error, msgspec.DecodeError):
            continue  # deleted meanwhile, or not ours to show
    return found
