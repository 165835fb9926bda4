"""``reach agents [--watch] | show ID | clear ID | forget ID``: who is registered, how the
coordinator judges them, their load and breakers; one agent in full, with the tasks it runs;
lifting a quarantine; retiring an agent gone for good."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time

from agentreach.broker import Broker, BrokerTimeout, NoResponders
from agentreach.cli import agent_detail
from agentreach.cli.agent_rows import (
    Row,
    as_json,
    breaker_shown,
    collect,
    load_of,
    state_of,
    tripped,
)
from agentreach.cli.options import (
    Commands,
    MissingArgument,
    UsageError,
    an_id,
    broker_of,
    operators_only,
)
from agentreach.cli.redraw import redraw_until_interrupted
from agentreach.cli.retirement import forget, queued
from agentreach.cli.status import NOT_RUNNING, warn_without_coordinator
from agentreach.cli.terminal import one_line

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
        "registered agents and their liveness | show ID | clear ID | forget ID",
        example=(
            "reach agents --watch",
            "reach agents show summarizer-1",
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
        choices=["list", "show", "clear", "forget"],
        default="list",
        help="list (default) the agents; show one in full, with the tasks it runs now (their"
        " execution records) and what waits in its queues; clear the quarantine of one; or"
        " forget an OFFLINE or STOPPED one (its card, heartbeat, liveness, breakers and"
        " dispatch consumers are deleted, its queued tasks reassigned; it may register again)",
    )
    agents.add_argument(
        "id",
        nargs="?",
        type=an_id,
        help="show: the agent's id; clear: the quarantined agent's; forget: the retired agent's",
    )
    agents.add_argument(
        "--json",
        action="store_true",
        help="list: one JSON object per agent and line (for scripts), not the table; show:"
        " the agent as one JSON object",
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
    if args.json and (args.action not in ("list", "show") or args.watch is not None):
        raise UsageError("--json is for agents list or show, once (not --watch)")
    if args.watch is not None and args.action not in ("list", "show"):
        raise UsageError(f"--watch is for agents list or show, not {args.action}")
    if args.action == "list" and args.id:
        raise UsageError(f"agents list takes no agent id (got {args.id!r}): it lists them all")
    operators_only(args, "the agent registry")
    async with broker_of(args) as broker:
        if args.action == "clear":
            return await _clear(broker, args.id)
        if args.action == "show":
            return await _show(broker, args)
        if args.action == "forget":
            if not args.id:
                raise MissingArgument("agents forget needs the id of an OFFLINE or STOPPED agent")
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


async def _show(broker: Broker, args: argparse.Namespace) -> int:
    if not args.id:
        raise MissingArgument("agents show needs an agent's id (`reach agents` lists them)")
    running = await warn_without_coordinator(
        broker, "STATE is the last verdict recorded, and nobody judges liveness now"
    )
    enforced = any(status.get("enforces_allowances") for status in running)

    async def shown() -> str:
        detail = await agent_detail.detail_of(broker, args.id, allowances_enforced=enforced)
        return agent_detail.render(detail, int(time.time() * 1000))

    if args.json:
        detail = await agent_detail.detail_of(broker, args.id, allowances_enforced=enforced)
        print(json.dumps(agent_detail.detail_json(detail), ensure_ascii=False))
        return 0
    if not args.watch:
        print(await shown())
        return 0
    return await redraw_until_interrupted(shown, args.watch)


async def _table(broker: Broker, allowances_enforced: bool) -> str:
    return render(await collect(broker, allowances_enforced=allowances_enforced))


async def _clear(broker: Broker, agent_id: str | None) -> int:
    if not agent_id:
        raise MissingArgument("agents clear needs the id of a quarantined agent")
    try:
        answer = await broker.request(broker.names.clear, agent_id.encode(), timeout=5)
    except (NoResponders, BrokerTimeout):
        raise UsageError(NOT_RUNNING) from None
    said = answer.data.decode(errors="replace")
    if said not in ("cleared", "not quarantined"):
        raise UsageError(f"{agent_id}: {said}")  # an unknown agent: said as every error is
    print(f"{agent_id}: {'quarantine lifted' if said == 'cleared' else said}")
    if not_closed := await tripped(broker, agent_id):
        shown = ", ".join(breaker_shown(b, int(time.time() * 1000)) for b in not_closed)
        print(
            f"{agent_id}: its breakers are not cleared ({shown}): each closes when a trial"
            " call succeeds, after its open time, or when the agent stops"
        )
    return 0


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


def _line(row: Row) -> str:
    card, judged = row.card, row.liveness
    state = state_of(row)
    if judged and judged.quarantined:
        state = "QUARANT."
    if card.agent_id != row.key:  # the coordinator does not believe it either
        return f"{row.key:<22} {'IGNORED':<9} its card names another agent, {card.agent_id!r}"
    since = (
        dt.datetime.fromtimestamp(judged.since_ms / 1000).strftime("%H:%M:%S") if judged else "-"
    )
    age = f"{row.beat_age_s:.1f}s" if row.beat_age_s is not None else "-"
    running = load_of(row, state)
    load = f"{running[0]}/{running[1]}" if running else "-"
    intents = ",".join(f"{t}@{i.version}" for t, i in sorted(card.intents.items()))
    tags = ",".join(f"{k}={v}" for k, v in sorted(card.tags.items())) or "-"
    now = int(time.time() * 1000)
    breakers = ",".join(breaker_shown(b, now) for b in row.breakers) or "-"
    line = one_line(
        f"{card.agent_id:<22} {state:<9} {since:<9} {age:>6} {load:>7}"
        f"  {intents}  {tags}  {breakers}"
    )
    # The coordinator routes none of these to it: the card names them, its creds do not.
    refusals = [one_line(f"{'':<22} REFUSED   {intent}: {why}") for intent, why in row.refused]
    if judged and judged.quarantined:  # no work until a person lifts it: say why and how
        refusals.insert(0, f"{'':<22} QUARANT.  {_quarantine_said(card.agent_id)}")
    return "\n".join([line, *refusals])


def _quarantine_said(agent_id: str) -> str:
    return (
        "went OFFLINE more often within an hour than liveness.flapping_limit allows: it"
        f" gets no work until a person looks at it and runs `reach agents clear {agent_id}`"
    )
