"""Sending on a task taken from a gone agent (:mod:`reassign`) as its next attempt: through
intake again, with the ttl it has left; or ending it here when too little is left or the
attempt that killed its agent was its last.

A move is cut short when the coordinator or the server dies between the fence of the old
attempt and the send: the gone agent's next process then finds the attempt fenced, and
reports it (``failed`` with the fence's error); :mod:`~agentreach.coordinator.delivery.outcomes`
sends it on from there unless a later attempt shows it was sent (a chaos run: a task the
fence took from an agent, never sent on, lost)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker
from agentreach.broker.lifecycle import emit, event_for, events_of
from agentreach.broker.streams import StoredMessage
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.delivery.retries import RetryConfig
from agentreach.coordinator.routing.run_once import (
    REASSIGNED,
    RanAlready,
    Running,
    RunOnce,
    answer_from_record,
    lease_limit,
    verdict_of,
)
from agentreach.envelopes import ErrorInfo, Event, Execution, Task, now_ms, ttl_left_ms
from agentreach.envelopes.headers import task_headers

log = structlog.get_logger("coordinator.reassign")
Allowed = Callable[[Task, str], int]  # the attempts a task taken from an agent gets

STOPPED = "stopped"  # cleanly: what its stop cut short was not the task's doing
MOVED_MIN_LEFT_MS = 100  # less left: expired here (sent on, its letter blamed the peer)
_ENDINGS = frozenset({"completed", "dead_lettered"})


class Gone(NamedTuple):
    """The agent process the tasks are taken from, and why."""

    agent_id: str
    epoch: int
    why: str
    allowed: Allowed


def default_allowed(task: Task, agent_id: str) -> int:
    return RetryConfig().allowed(task, None)


async def forward(
    broker: Broker, task: Task, gone: Gone, run_once: RunOnce, *, ran: bool, dispatched_ms: int
) -> Literal["reassigned", "past_ttl", "kept", "exhausted"]:
    """Send ``task`` (dispatched at ``dispatched_ms``, fenced from ``gone``; ``ran``: its
    agent had begun it) on as its next attempt, or end it here; ``kept`` when a process of
    that very agent runs it (see :func:`_expire`)."""
    agent_id, _, why, _ = gone
    left_ms = ttl_left_ms(task.ttl_ms, dispatched_ms)
    if left_ms < MOVED_MIN_LEFT_MS:  # said here, of the agent it was with
        ttl_end_ms = dispatched_ms + task.ttl_ms
        expired = await _expire(broker, task, agent_id, run_once, why, ttl_end_ms)
        return "past_ttl" if expired else "kept"
    counts = ran and why != STOPPED
    if counts and task.attempts_run >= (allowed := gone.allowed(task, agent_id)):
        ttl_end_ms = dispatched_ms + task.ttl_ms
        await _exhaust(broker, task, gone, run_once, allowed, ttl_end_ms)
        return "exhausted"
    retry = msgspec.structs.replace(
        task,
        attempt=task.attempt + 1,
        requeued=task.requeued + (0 if counts else 1),
        to_agent=None,
        ttl_ms=left_ms,
    )
    of = f"{task.caller}." if task.caller else ""  # another caller's, moved, took its id
    headers = task_headers(retry, msg_id=f"{of}{task.message_id}-{retry.attempt}")
    # On its own intake subject: an operator's burst on the bare one cannot refuse it.
    subject = broker.names.coordinator_task(task.topic)
    await broker.publish(subject, envelopes.encode(retry), headers=headers)
    # The trace says why attempt + 1 comes (else nothing stands between the two attempts).
    said = f"{agent_id} {why} " + ("while running it" if ran else "before it ran")
    error = ErrorInfo(type=REASSIGNED, message=said, retryable=True)
    scheduled = event_for(
        task, "retry_scheduled", next_attempt=retry.attempt, delay_ms=0, error=error
    )
    await emit(broker, scheduled)
    return "reassigned"


async def send_on_cut_short(
    broker: Broker,
    task: Task,
    agent_id: str,
    records: list[Execution],
    run_once: RunOnce,
    *,
    allowed: Allowed,
    dispatched_ms: int,
) -> bool:
    """Send ``task`` on when its move was cut short: ``agent_id``'s record of this attempt is
    the fence of a move, and nothing shows that the move sent it on. True when it did."""
    fence = next((r for r in records if _fences(r, agent_id, task.attempt)), None)
    if fence is None or fence.error is None:
        return False
    events = await events_of(broker, task.trace_id, task.message_id)
    if moved_on(events.run_of(broker.names, task.caller), task.attempt):
        return False
    why = fence.error.message.removeprefix("its agent ")
    log.warning("a move of the task was cut short after its fence; sent on now", agent_id=agent_id)
    gone = Gone(agent_id, fence.epoch, why, allowed)
    ran = bool(fence.started_ms)
    await forward(broker, task, gone, run_once, ran=ran, dispatched_ms=dispatched_ms)
    return True


def _fences(record: Execution, agent_id: str, attempt: int) -> bool:
    error = record.error
    return (record.agent_id, record.attempt, record.state) == (agent_id, attempt, "failed") and (
        error is not None and error.type == REASSIGNED
    )


def moved_on(events: list[tuple[StoredMessage, Event]], attempt: int) -> bool:
    """Whether a run's events show it went on from ``attempt``: a later attempt, a retry
    scheduled, or its end."""
    for _, event in events:
        if event.attempt > attempt or event.event in _ENDINGS:
            return True
        if event.event == "retry_scheduled" and event.detail.get("next_attempt", 0) > attempt:
            return True
    return False


async def _exhaust(
    broker: Broker, task: Task, gone: Gone, run_once: RunOnce, allowed: int, ttl_end_ms: int
) -> None:
    """End a task whose last allowed attempt's agent went away while running it (a task
    that kills its agent must not take down one agent after another), unless that run
    finished after all (its record answers it) or another agent runs it now."""
    records = await run_once.records(task)
    match verdict_of(records, until_ms=lease_limit(task, ttl_end_ms)):
        case RanAlready(record=record):
            await answer_from_record(broker, task, record)
        case Running():
            log.info("its attempts ran out, but another agent runs it now", agent=gone.agent_id)
        case None:
            message = (
                f"{gone.agent_id} {gone.why} while running attempt {task.attempt};"
                f" {task.attempts_run} of the {allowed} attempts allowed ran"
            )
            # Not retryable: sent again, it would take down more agents.
            error = ErrorInfo(type=REASSIGNED, message=message, retryable=False)
            await end_with_error(broker, task, "retries_exhausted", error)


async def _expire(
    broker: Broker, task: Task, agent_id: str, run_once: RunOnce, why: str, ttl_end_ms: int
) -> bool:
    """Dead-letter the task as expired, unless it ran after all (an agent finished it and
    its acknowledgement was lost): then its stored result answers. One that another agent
    runs now is left to that run. False when a process of this very agent holds a live
    lease of it (a newer one, or one whose fence lost to a renewal): the message then stays
    in its queue, for that run to acknowledge or a later reassignment to find."""
    records = await run_once.records(task)
    match verdict_of(records, until_ms=lease_limit(task, ttl_end_ms)):
        case RanAlready(record=record):
            await answer_from_record(broker, task, record)
        case Running():
            now = now_ms()
            mine = (r for r in records if r.agent_id == agent_id and r.state == "running")
            if any(r.lease_until_ms > now for r in mine):
                log.info(
                    "past its ttl, but a process of its agent runs it; kept", agent_id=agent_id
                )
                return False
            log.info("past its ttl, but another agent runs it now", message_id=task.message_id)
        case None:
            message = f"ttl {task.ttl_ms} ms ran out with {agent_id}, which {why}"
            error = ErrorInfo(type="expired", message=message, retryable=False)
            await end_with_error(broker, task, "expired", error)
    return True
