"""``reach agents [--watch] | clear ID | forget ID``: who is registered, how the coordinator
judges them, their load and breakers; lifting a quarantine; retiring an agent gone for good."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from dataclasses import dataclass

from agentreach.broker import Broker, BrokerTimeout, NoResponders, StreamNotFound
from agentreach.cli.options import Commands, UsageError, broker_of, operators_only
from agentreach.cli.redraw import redraw_until_interrupted
from agentreach.cli.retirement import forget, queued
from agentreach.cli.status import NOT_RUNNING, warn_without_coordinator
from agentreach.coordinator.routing import allowances
from agentreach.envelopes import AgentCard, BreakerRecord, Heartbeat, Liveness

MIN_WATCH_S = 0.5
LOAD_EXPLAINED = (
    "LOAD is in-flight/slots from the agent's last heartbeat: handlers running now, out of how"
    " many it runs at once\n(the sum of its handlers' capacity, per priority). Work queued"
    " before those slots is queue depth\n(`reach top`, reach_queue_depth)."
)


def register(commands: Commands) -> None:
    agents = commands.add(
        "agents",
        cmd_agents,
        "registered agents and their liveness | clear ID | forget ID",
        example=(
            "reach agents --watch",
            "reach agents clear worker-cn-east-01",
            "reach agents forget researcher-2",
        ),
    )
    agents.description = (
        "Registered agents, as the coordinator judges them.\n\n" + LOAD_EXPLAINED + "\n"
    )
    agents.add_argument(
        "action",
        nargs="?",
        choices=["list", "clear", "forget"],
        default="list",
        help="list (default) the agents, clear the quarantine of one, or forget an OFFLINE or"
        " STOPPED one (its card, heartbeat, liveness, breakers and dispatch consumers are"
        " deleted, its queued tasks reassigned; it may register again)",
    )
    agents.add_argument(
        "id", nargs="?", help="clear: the quarantined agent's id; forget: the retired agent's"
    )
    agents.add_argument(
        "--json",
        action="store_true",
        help="list: one JSON object per agent and line (for scripts), not the table",
    )
    agents.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        help="redraw every N seconds (default 2) until Ctrl-C",
    )


async def cmd_agents(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch < MIN_WATCH_S:
        raise UsageError(f"--watch takes seconds between redraws, at least {MIN_WATCH_S}")
    if args.json and (args.action != "list" or args.watch is not None):
        raise UsageError("--json is for agents list, once (not --watch)")
    if args.action == "list" and args.id:
        raise UsageError(f"agents list takes no agent id (got {args.id!r}): it lists them all")
    operators_only(args, "the agent registry")
    async with broker_of(args) as broker:
        if args.action == "clear":
            return await _clear(broker, args.id)
        if args.action == "forget":
            if not args.id:
                raise UsageError("agents forget needs the id of an OFFLINE or STOPPED agent")
            print(await forget(broker, args.id))
            if await queued(broker, args.id):
                await warn_without_coordinator(broker, "its queued tasks move when one starts")
            return 0
        running = await warn_without_coordinator(
            broker, "STATE is the last verdict recorded, and nobody judges liveness now"
        )
        # Only a coordinator with its seal key refuses what the allowances do not name.
        enforced = any(status.get("enforces_allowances") for status in running)
        if args.json:
            for row in await collect(broker, allowances_enforced=enforced):
                print(json.dumps(as_json(row), ensure_ascii=False))
            return 0
        if not args.watch:
            print(render(await collect(broker, allowances_enforced=enforced)))
            return 0
        return await redraw_until_interrupted(lambda: _table(broker, enforced), args.watch)


async def _table(broker: Broker, allowances_enforced: bool) -> str:
    return render(await collect(broker, allowances_enforced=allowances_enforced))


async def _clear(broker: Broker, agent_id: str | None) -> int:
    if not agent_id:
        raise UsageError("agents clear needs the id of a quarantined agent")
    try:
        answer = await broker.request(broker.names.clear, agent_id.encode(), timeout=5)
    except (NoResponders, BrokerTimeout):
        raise UsageError(NOT_RUNNING) from None
    said = answer.data.decode(errors="replace")
    if said not in ("cleared", "not quarantined"):
        raise UsageError(f"{agent_id}: {said}")  # an unknown agent: said as every error is
    print(f"{agent_id}: {'quarantine lifted' if said == 'cleared' else said}")
    if tripped := await _tripped(broker, agent_id):
        shown = ", ".join(breaker_shown(b, int(time.time() * 1000)) for b in tripped)
        print(
            f"{agent_id}: its breakers are not cleared ({shown}): each closes when a trial"
            " call succeeds, after its open time, or when the agent stops"
        )
    return 0


def breaker_shown(breaker: BreakerRecord, now_ms: int) -> str:
    """``intent:state`` (``ISOLATED:…`` for an isolation). An open breaker whose open time
    has passed stays open until a call comes to be its trial: said, or it reads as stuck."""
    state = breaker.state
    if state == "open" and now_ms >= breaker.open_until_ms:
        state = "open(trial due)"
    return f"{breaker.intent or 'ISOLATED'}:{state}"


async def _tripped(broker: Broker, agent_id: str) -> list[BreakerRecord]:
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


def render(rows: list[Row]) -> str:
    if not rows:
        return "no agents registered"
    header = (
        f"{'AGENT':<22} {'STATE':<9} {'SINCE':<9} {'BEAT':>6} {'LOAD':>7}  INTENTS  TAGS  BREAKERS"
    )
    isolated = sum(row.isolated for row in rows)
    quarantined = sum(bool(row.liveness and row.liveness.quarantined) for row in rows)
    footer = (
        f"{len(rows)} agents, {isolated} isolated, {quarantined} quarantined"
        " · LOAD = handlers running / slots"
    )
    return "\n".join([header, *(_line(row) for row in rows), footer])


def _state(row: Row) -> str:
    # A stopped card is STOPPED whatever its last verdict, as in `reach top` and the metrics.
    judged = row.liveness
    return "STOPPED" if row.card.status != "running" else judged.state if judged else "UNKNOWN"


def _load(row: Row, state: str) -> tuple[int, int] | None:
    """Handlers running and slots, from its last heartbeat; None for an agent gone (what its
    last heartbeat said is not its load)."""
    beat = row.heartbeat
    if beat is None or state in ("OFFLINE", "STOPPED"):
        return None
    return beat.in_flight, beat.in_flight + beat.free_slots


def as_json(row: Row) -> dict[str, object]:
    """What the table shows of an agent, for scripts (``reach agents --json``)."""
    state, judged = _state(row), row.liveness
    load = _load(row, state)
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


def _line(row: Row) -> str:
    card, judged = row.card, row.liveness
    state = _state(row)
    if judged and judged.quarantined:
        state = "QUARANT."
    if card.agent_id != row.key:  # the coordinator does not believe it either
        return f"{row.key:<22} {'IGNORED':<9} its card names another agent, {card.agent_id!r}"
    since = (
        dt.datetime.fromtimestamp(judged.since_ms / 1000).strftime("%H:%M:%S") if judged else "-"
    )
    age = f"{row.beat_age_s:.1f}s" if row.beat_age_s is not None else "-"
    running = _load(row, state)
    load = f"{running[0]}/{running[1]}" if running else "-"
    intents = ",".join(f"{t}@{i.version}" for t, i in sorted(card.intents.items()))
    tags = ",".join(f"{k}={v}" for k, v in sorted(card.tags.items())) or "-"
    now = int(time.time() * 1000)
    breakers = ",".join(breaker_shown(b, now) for b in row.breakers) or "-"
    line = (
        f"{card.agent_id:<22} {state:<9} {since:<9} {age:>6} {load:>7}"
        f"  {intents}  {tags}  {breakers}"
    )
    # The coordinator routes none of these to it: the card names them, its creds do not.
    refusals = [f"{'':<22} REFUSED   {intent}: {why}" for intent, why in row.refused]
    if judged and judged.quarantined:  # no work until a person lifts it: say why and how
        refusals.insert(0, f"{'':<22} QUARANT.  {_quarantine_said(card.agent_id)}")
    return "\n".join([line, *refusals])


def _quarantine_said(agent_id: str) -> str:
    return (
        "went OFFLINE more often within an hour than liveness.flapping_limit allows: it"
        f" gets no work until a person looks at it and runs `reach agents clear {agent_id}`"
    )
