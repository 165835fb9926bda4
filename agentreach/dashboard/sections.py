"""The agents, dead letters and workflows sections of the dashboard's snapshot, as JSON."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import msgspec

from agentreach.agents.letters import letter_state
from agentreach.dashboard.letters import OPEN_SHOWN
from agentreach.envelopes import PRIORITIES, DeadLetter, now_ms

if TYPE_CHECKING:
    from agentreach.dashboard.views import Board


def agents(board: Board) -> list[dict[str, Any]]:
    """Every registered agent: liveness, load, queues, breakers that are not closed."""
    rows = []
    tripped: dict[str, list[dict[str, Any]]] = {}
    for record in board.breakers.records.values():
        if record.state != "closed":
            tripped.setdefault(record.agent_id, []).append(
                {
                    "intent": record.intent,
                    "state": record.state,
                    "since_ms": record.since_ms,
                    "reason": record.reason,
                }
            )
    now = now_ms()
    for card in sorted(board.directory.cards.values(), key=lambda c: c.agent_id):
        judged = board.directory.liveness.get(card.agent_id)
        state = judged.state if judged else "UNKNOWN"
        died = judged is not None and judged.state == "OFFLINE" and judged.epoch >= card.epoch
        if card.status != "running" and not (card.status == "draining" and died):
            state = card.status.upper()  # STOPPED, or DRAINING while its handlers finish
        beat = board.heartbeats.beats.get(card.agent_id)
        breakers = sorted(tripped.get(card.agent_id, []), key=lambda b: b["intent"])
        rows.append(
            {
                "agent_id": card.agent_id,
                "state": state,
                "since_ms": judged.since_ms if judged else card.started_at,
                "reason": judged.reason if judged else "",
                "quarantined": bool(judged and judged.quarantined),
                "isolated": any(b["intent"] == "" for b in breakers),
                "epoch": card.epoch,
                "host": card.host,
                "pid": card.pid,
                "tags": card.tags,
                "intents": [
                    {"name": n, "version": i.version, "capacity": i.capacity}
                    for n, i in sorted(card.intents.items())
                ],
                "heartbeat": _beat(beat, now),
                "queues": _queues(board, card.agent_id),
                "breakers": breakers,
            }
        )
    return rows


def _beat(beat: Any, now: int) -> dict[str, Any] | None:
    if beat is None:
        return None
    heartbeat, seen_ms = beat
    return {
        "seen_ms": seen_ms,
        "age_ms": now - seen_ms,
        "interval_s": heartbeat.interval_s,
        "in_flight": heartbeat.in_flight,
        "free_slots": heartbeat.free_slots,
        "latency_ms": heartbeat.latency_ms,
    }


def _queues(board: Board, agent_id: str) -> dict[str, Any]:
    queues = board.queues
    if queues is None:
        return {}
    return {
        p: {
            "depth": queues.depth(agent_id, p),
            "capacity": queues.capacity(p),
            "above_watermark": queues.why_full(agent_id, p) is not None,
        }
        for p in PRIORITIES
    }


def dead_letters(board: Board) -> dict[str, Any]:
    """Counts by reason (all of ``REACH_DLQ``), the most recent letters, each with its
    state as ``reach dlq list`` says it (open, replayed, resolved, handled), and the open
    ones of all (up to ``OPEN_SHOWN``, and how many more)."""
    by_reason = board.sampled.dlq_by_reason
    last: Counter[str] = Counter()
    for _, stored_ms, letter in board.letters:
        last[letter.reason] = max(last[letter.reason], stored_ms)
    reasons = [
        {"reason": reason, "count": count, "last_ms": last.get(reason) or None}
        for reason, count in sorted(by_reason.items(), key=lambda rc: (-rc[1], rc[0]))
    ]
    open_letters = board.open_letters.newest(OPEN_SHOWN)
    total = sum(by_reason.values())
    # The counts are read just after the open letters (Board.refresh): between those two
    # reads, or when letters expire or are deleted in between, open could pass the total.
    opened = min(len(board.open_letters), total)
    return {
        "total": total,
        "by_reason": reasons,
        "recent": [_letter(board, *shown) for shown in board.letters],
        "open": opened,  # of every letter REACH_DLQ keeps
        "open_letters": [_letter(board, *shown) for shown in open_letters],
        "open_not_shown": max(0, opened - len(open_letters)),
    }


def _letter(board: Board, seq: int, stored_ms: int, letter: DeadLetter) -> dict[str, Any]:
    return {
        "seq": seq,
        "message_id": letter.message_id,
        "trace_id": letter.trace_id,
        "topic": letter.topic,
        "reason": letter.reason,
        "attempts": letter.attempts,
        "error": msgspec.to_builtins(letter.error) if letter.error else None,
        "at_ms": stored_ms,
        "replayable": letter.envelope is not None,
        "replayed_as": board.replayed.get(letter.message_id),
        "resolved": board.resolved.get(letter.message_id),
        "state": letter_state(board.settling.get(letter.message_id), letter),
    }


def workflows(board: Board) -> dict[str, Any]:
    """Instances in flight, oldest first."""
    census = board.census
    by_status: Counter[str] = Counter(r.status for r in census.in_flight.values())
    in_flight = sorted(census.in_flight.values(), key=lambda r: r.started_ms)[:50]
    return {
        "by_status": dict(by_status),
        "in_flight": [
            {
                "instance_id": r.instance_id,
                "workflow": r.workflow,
                "trace_id": r.trace_id,
                "status": r.status,
                "current": r.current,
                "started_ms": r.started_ms,
                "deadline_ms": r.deadline_ms,
                "steps_done": r.steps_done,
                # A state machine's (and an older record's): the states entered so far
                "steps_total": r.steps_total or len(r.steps),
                "running": r.running,
            }
            for r in in_flight
        ],
    }
