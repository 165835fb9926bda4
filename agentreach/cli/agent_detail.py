"""``reach agents show ID``: one agent in full — its card, how the coordinator judges it,
its last heartbeat, the tasks it runs now (from their execution records) and what waits in
its queues. Celery's ``inspect active``, for one agent, read from the broker alone."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentreach.broker import Broker
from agentreach.broker.direct import subject_counts
from agentreach.cli.agent_rows import Row, as_json, breaker_shown, refused_to, state_of, tripped
from agentreach.cli.options import UsageError
from agentreach.cli.terminal import one_line
from agentreach.envelopes import (
    PRIORITIES,
    AgentCard,
    DecodeError,
    Execution,
    Heartbeat,
    Liveness,
)


@dataclass(frozen=True, slots=True)
class Detail:
    agent_id: str
    row: Row | None  # None: no card (never registered, or forgotten)
    running: tuple[Execution, ...]  # its records of runs not ended, oldest first
    queued: dict[str, int]  # priority → tasks waiting in its dispatch queue


async def detail_of(broker: Broker, agent_id: str, *, allowances_enforced: bool) -> Detail:
    """What the broker holds of ``agent_id``; raises UsageError when it holds nothing."""
    row = await _row(broker, agent_id, allowances_enforced)
    records = await (await broker.bucket(broker.names.executions_bucket, Execution)).matching(
        f"*.*.{agent_id}"
    )
    running = sorted(
        (entry.value for entry in records.values() if entry.value.state == "running"),
        key=lambda record: record.started_ms or record.lease_until_ms,
    )
    queued = {priority: await _queued(broker, agent_id, priority) for priority in PRIORITIES}
    if row is None and (why := await _card_unreadable(broker, agent_id)):
        # `reach agents` leaves such a card out: "no agent" said it was never there.
        raise UsageError(
            f"agent {agent_id!r}: its card is unreadable ({why}); something other than the"
            " agent wrote its key (a NATS server's answer aimed at it, say): the agent writes"
            " its card again at its next look, within a few heartbeats"
        )
    if row is None and not running and not any(queued.values()):
        raise UsageError(
            f"no agent {agent_id!r}: no card, no task running or queued (`reach agents` lists"
            " the registered ones)"
        )
    return Detail(agent_id, row, tuple(running), queued)


async def _card_unreadable(broker: Broker, agent_id: str) -> str | None:
    """Why the value under ``agent_id``'s card key is no card; None when it is one, or none
    is there."""
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    try:
        await cards.get(agent_id)
    except DecodeError as exc:
        return str(exc)
    return None


async def _row(broker: Broker, agent_id: str, allowances_enforced: bool) -> Row | None:
    names = broker.names
    cards = await (await broker.bucket(names.agents_bucket, AgentCard)).matching(agent_id)
    if (card := cards.get(agent_id)) is None:
        return None
    judged = await (await broker.bucket(names.liveness_bucket, Liveness)).matching(agent_id)
    beats = await (await broker.bucket(names.heartbeats_bucket, Heartbeat)).matching(agent_id)
    beat = beats.get(agent_id)
    age = time.time() - beat.written_ms / 1000 if beat and beat.written_ms else None
    liveness = judged[agent_id].value if agent_id in judged else None
    return Row(
        agent_id,
        card.value,
        liveness,
        beat.value if beat else None,
        age,
        tuple(await tripped(broker, agent_id)),
        # A card naming another agent is not believed: nothing is routed to it to refuse.
        await refused_to(broker, card.value)
        if allowances_enforced and card.value.agent_id == agent_id
        else (),
    )


async def _queued(broker: Broker, agent_id: str, priority: str) -> int:
    names = broker.names
    counts, _ = await subject_counts(
        broker, names.dispatch_stream(priority), names.dispatch(agent_id, priority)
    )
    return sum(counts.values())


def render(detail: Detail, now_ms: int) -> str:
    """The agent as a few labelled lines, then its running tasks as a table."""
    lines = (
        _card_lines(detail.row, now_ms)
        if detail.row
        else [f"agent     {detail.agent_id}: no card (never registered, or forgotten)"]
    )
    queued = " · ".join(f"{p} {n}" for p, n in detail.queued.items())
    lines.append(f"queued    {queued} (the running ones among them, until acknowledged)")
    lapsed = sum(record.lease_until_ms <= now_ms for record in detail.running)
    stale = f"; {lapsed} of them lapsed: runs that died or stalled" if lapsed else ""
    lines.append(f"running   {len(detail.running)} (from their execution records{stale})")
    if detail.running:
        epoch = detail.row.card.epoch if detail.row else 0
        lines.append(
            f"  {'MESSAGE_ID':<38} {'ATTEMPT':>7}  {'CALLER':<16} {'FOR':>8}  {'EPOCH':>13}  LEASE"
        )
        lines.extend(_running_line(record, now_ms, epoch) for record in detail.running)
    return "\n".join(map(one_line, lines))  # a line an agent wrote is one line


def _card_lines(row: Row, now_ms: int) -> list[str]:
    card, judged, beat = row.card, row.liveness, row.heartbeat
    state = state_of(row)
    judged_said = f" ({judged.reason})" if judged and judged.reason else ""
    if judged and judged.quarantined:
        judged_said += ", QUARANTINED: `reach agents clear` lifts it"
    lines = [f"agent     {row.key} (epoch {card.epoch})  {state}{judged_said}"]
    if beat is not None and row.beat_age_s is not None:
        busy = f" · {beat.in_flight} of {beat.in_flight + beat.free_slots} slots busy at that beat"
        lines.append(
            f"heartbeat {row.beat_age_s:.1f} s ago, every {beat.interval_s:g} s"
            + (busy if state not in ("OFFLINE", "STOPPED") else "")
        )
    else:
        lines.append("heartbeat none")
    for topic, intent in sorted(card.intents.items()):
        deadline = f"{intent.deadline_ms} ms" if intent.deadline_ms else "none (the task's budget)"
        attempts = intent.max_attempts or "the coordinator's setting"
        lines.append(
            f"intent    {topic}@{intent.version}: capacity {intent.capacity}, deadline"
            f" {deadline}, max_attempts {attempts}"
        )
    if card.tags:
        lines.append("tags      " + ",".join(f"{k}={v}" for k, v in sorted(card.tags.items())))
    if row.breakers:
        lines.append("breakers  " + ",".join(breaker_shown(b, now_ms) for b in row.breakers))
    lines.extend(f"refused   {intent}: {why}" for intent, why in row.refused)
    return lines


def _running_line(record: Execution, now_ms: int, card_epoch: int) -> str:
    ran_for = f"{(now_ms - record.started_ms) / 1000:.1f}s" if record.started_ms else "-"
    left_s = (record.lease_until_ms - now_ms) / 1000
    lease = f"{left_s:.1f}s left" if left_s > 0 else f"lapsed {-left_s:.1f}s ago"
    if record.epoch and record.epoch < card_epoch:  # a process gone since: its claim lapses
        lease += ", an earlier process's (it died or was restarted)"
    caller = record.caller or "-"
    return (
        f"  {record.message_id:<38} {record.attempt:>7}  {caller:<16} {ran_for:>8}"
        f"  {record.epoch:>13}  {lease}"
    )


def detail_json(detail: Detail) -> dict[str, object]:
    """``reach agents show ID --json``: the list's fields, its running tasks and queues."""
    shown: dict[str, object] = as_json(detail.row) if detail.row else {"agent_id": detail.agent_id}
    shown["running"] = [
        {
            "message_id": record.message_id,
            "caller": record.caller,
            "attempt": record.attempt,
            "epoch": record.epoch,
            "started_ms": record.started_ms or None,
            "lease_until_ms": record.lease_until_ms,
        }
        for record in detail.running
    ]
    shown["queued"] = dict(detail.queued)
    return shown
