"""Attempts an agent acknowledged and never reported: ended as ``expired``, once.

The SDKs (and the conformance kit) acknowledge a dispatch only once its outcome is
recorded, so an agent that dies mid-run leaves the dispatch in its queue, where a
redelivery, a reassignment or the queue sweep (:mod:`~agentreach.coordinator.liveness.
queue_expiry`) finds it. An agent that acknowledges on receipt and then crashes, hangs or
drops the work leaves nothing: the work-queue stream forgets the dispatch, and the trace
stops at ``routed`` (or ``accepted``), with no letter and no answer.

So one replica (the ``queue_expiry`` duty's) follows the attempts the coordinator routes:
it reads ``routed``, ``accepted`` and the endings from REACH_EVENTS as they are stored and
keeps each open attempt with the last moment a conforming agent could still report it —
the dispatch's ttl (the latest it may start) and its execute budget, or the budget from
the agent's ``accepted`` when that is sooner, plus ``grace_s``. An attempt still open then,
with no ending among its events, no live claim and its dispatch no longer in its agent's
queue (one still there was not acknowledged: a paused agent's), is fenced in its agent's execution
record (:mod:`~agentreach.coordinator.delivery.expiry`: a report that comes later is a
late one) and ended as ``expired``: a dead letter (without the task: its body left with
the acknowledged dispatch), the error to its sender, and an ``alert``
(``problem: unreported``) naming the agent.

Nothing is written per task. The open attempts are kept in memory; each pass stores when
the oldest of them was routed (``reach_leases``, key ``unreported-since``), and a replica
that takes the duty over reads the events from there (``lookback_s`` back without one).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import msgspec
import structlog

from agentreach.broker import Broker, BrokerError, Bucket, Delivery
from agentreach.broker.consume import follow
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.direct import messages_on
from agentreach.broker.errors import pause
from agentreach.broker.lifecycle import agent_event, emit, events_of, reply
from agentreach.broker.names import COORDINATOR
from agentreach.coordinator.delivery.dead_letters import error_reply
from agentreach.coordinator.delivery.expiry import EXPIRED, fence_expiry
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing.run_once import RanAlready, Running, RunOnce, verdict_of
from agentreach.coordinator.units import NonNegativeSeconds, PositiveSeconds
from agentreach.envelopes import (
    DEFAULT_TTL_MS,
    Budget,
    DecodeError,
    ErrorInfo,
    Execution,
    Task,
    decode_task,
    moved_on_from,
    now_ms,
    server_answer,
)

log = structlog.get_logger("coordinator.unreported")

UNREPORTED = "unreported"  # the alert's problem
MARK_KEY = "unreported-since"
JUDGED_PER_PASS = 100
QUEUE_LOOKS = 1_000  # dispatches read in an agent's queue for the one of an attempt
ENDINGS = frozenset({"completed", "failed", "expired"})  # an agent's report of its attempt
FOLLOWED = ("routed", "accepted", *sorted(ENDINGS), "dead_lettered")


class UnreportedConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How attempts acknowledged without an outcome are found: one ends within its ttl, its
    execute budget, ``grace_s`` and ``every_s`` of its dispatch."""

    enabled: bool = True
    every_s: PositiveSeconds = 5.0  # how often open attempts are looked at
    # Past the ttl and the execute budget, how long an agent has to report before the
    # coordinator ends the attempt (its clock, its outcome's retries under broker trouble).
    grace_s: NonNegativeSeconds = 60.0
    lookback_s: PositiveSeconds = 3600.0  # how far back the first holder reads, with no mark


class _Dispatched(msgspec.Struct):
    """The parts of a ``routed`` event's detail read here (older events lack them)."""

    ttl_ms: int = DEFAULT_TTL_MS
    execute_ms: int = Budget().execute_ms
    reply_to: str | None = None


class _Seen(msgspec.Struct):
    """The parts of an event read here."""

    message_id: str
    trace_id: str
    topic: str
    attempt: int = 1
    agent_id: str | None = None
    caller: str | None = None
    priority: str = "P1"
    received_ms: int = 0
    detail: msgspec.Raw = msgspec.Raw(b"{}")


class _Since(msgspec.Struct, frozen=True):
    since_ms: int


@dataclass(slots=True)
class _Open:
    """An attempt routed and not reported yet."""

    routed: _Seen
    agent_id: str
    routed_ms: int  # the broker's time of storing its `routed`
    dispatched: _Dispatched
    due_ms: int  # when it is looked at

    def task(self) -> Task:
        """The task as far as its events tell it: ids, sender, reply address, no payload."""
        r = self.routed
        return Task(
            v=1,
            message_id=r.message_id,
            trace_id=r.trace_id,
            topic=r.topic,
            attempt=r.attempt,
            to_agent=self.agent_id,
            caller=r.caller,
            priority=r.priority,  # type: ignore[arg-type]
            received_ms=r.received_ms,
            ttl_ms=max(1, self.dispatched.ttl_ms),
            reply_to=self.dispatched.reply_to,
        )


class Unreported:
    """Ends the attempts agents acknowledged and never reported (:meth:`run`)."""

    def __init__(
        self, broker: Broker, config: UnreportedConfig, grants: Grants | None = None
    ) -> None:
        self._broker = broker
        self._config = config
        self._grants = grants or Grants(None)
        self._run_once = RunOnce(broker, self._grants)
        self._open: dict[tuple[str | None, str], _Open] = {}
        self._marked_ms = 0
        self.caught_up = asyncio.Event()
        self.ended = 0  # attempts this replica ended so, since it started

    async def run(self) -> None:
        """Follow the events and look at open attempts every ``every_s`` until cancelled."""
        if not self._config.enabled:
            return
        self._open.clear()
        self.caught_up.clear()
        since_ms = await self._since()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow(since_ms), name="unreported-follow")
            await self.caught_up.wait()
            while True:
                try:
                    await self.sweep()
                except BrokerError as exc:  # the next pass looks again
                    log.warning("unreported attempts not looked at", error=str(exc))
                await pause(self._config.every_s)  # the pass's own period

    async def _follow(self, since_ms: int) -> None:
        names = self._broker.names
        async for delivery in follow(
            self._broker,
            stream=names.events_stream,
            filter_subjects=tuple(names.events_of_kind(kind) for kind in FOLLOWED),
            since_ms=since_ms,
            caught_up=self.caught_up,
        ):
            self.fold(delivery)

    def fold(self, delivery: Delivery) -> None:
        """Open, narrow or close an attempt by one stored event."""
        names = self._broker.names
        kind, sender = (
            names.kind_of_event_subject(delivery.subject),
            names.sender_of(delivery.subject),
        )
        if not delivery.headers or server_answer(delivery.data, delivery.headers):
            return  # anyone's content, in anyone's name: the outcomes' consumer says so
        try:
            seen = msgspec.json.decode(delivery.data, type=_Seen)
        except msgspec.DecodeError:
            return  # the outcomes' and the audit's consumers dead-letter it
        key = (seen.caller, seen.message_id)
        found = self._open.get(key)
        if kind == "routed":
            if (
                sender == COORDINATOR
                and seen.agent_id
                and (found is None or found.routed.attempt <= seen.attempt)
            ):
                self._open[key] = self._opened(seen, seen.agent_id, delivery.timestamp_ms)
        elif found is None:
            return
        elif kind == "dead_lettered":
            del self._open[key]
        elif seen.attempt >= found.routed.attempt and sender in (found.agent_id, COORDINATOR):
            if kind != "accepted":
                del self._open[key]
            elif seen.attempt == found.routed.attempt:
                budget_ends = delivery.timestamp_ms + found.dispatched.execute_ms
                found.due_ms = min(found.due_ms, budget_ends + self._grace_ms)

    def _opened(self, routed: _Seen, agent_id: str, stored_ms: int) -> _Open:
        try:
            dispatched = msgspec.json.decode(routed.detail, type=_Dispatched)
        except msgspec.DecodeError:
            dispatched = _Dispatched()
        due_ms = stored_ms + dispatched.ttl_ms + dispatched.execute_ms + self._grace_ms
        return _Open(routed, agent_id, stored_ms, dispatched, due_ms)

    @property
    def _grace_ms(self) -> int:
        return int(self._config.grace_s * 1000)

    @property
    def open_count(self) -> int:
        return len(self._open)

    async def sweep(self) -> int:
        """One pass: end the open attempts past their time; how many it ended."""
        now = now_ms()
        due = sorted((o for o in self._open.values() if o.due_ms <= now), key=lambda o: o.due_ms)
        ended = 0
        for found in due[:JUDGED_PER_PASS]:
            ended += await self._judge(found)
        self.ended += ended
        await self._mark()
        return ended

    async def _judge(self, found: _Open) -> int:
        """End ``found`` unless it ended or runs after all: 1 when this ended it."""
        task, agent_id = found.task(), found.agent_id
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, agent_id=agent_id
        ):
            if await self._reported(task):
                self._close(found)
                return 0
            records = await self._run_once.records(task)
            if _ran_or_moved_on(records, task, agent_id):
                self._close(found)
                return 0
            if isinstance(running := verdict_of(records), Running):
                found.due_ms = now_ms() + int(running.left_s * 1000) + 1
                return 0
            if await _still_queued(self._broker, task):
                # Not acknowledged (its agent paused, say): not this pass's to end. Its
                # redelivery, its move when the agent is judged gone or the queue sweep
                # ends it; ended here, the move ran it again and it ended twice.
                found.due_ms = now_ms() + self._grace_ms
                return 0
            error = ErrorInfo(type=EXPIRED, message=_unreported(found), retryable=False)
            seal = self._grants.seal(task.caller, task.message_id, task.attempt, agent_id)
            fenced = await fence_expiry(
                self._broker,
                task,
                agent_id,
                error,
                seal=seal,
                ttl_end_ms=found.routed_ms + found.dispatched.ttl_ms,
            )
            if fenced == "running":
                found.due_ms = now_ms() + int(self._config.every_s * 1000)
                return 0
            self._close(found)
            if fenced == "ended":
                return 0
            await self._end(task, agent_id, error)
            return 1

    def _close(self, found: _Open) -> None:
        """Forget ``found``, unless a later attempt took its place while it was looked at."""
        key = (found.routed.caller, found.routed.message_id)
        if self._open.get(key) is found:
            del self._open[key]

    async def _reported(self, task: Task) -> bool:
        """Whether the attempt's events hold an ending (the fold may be behind them): the
        authentic ones only, so an agent's report counts only from the agent routed to."""
        found = await events_of(self._broker, task.trace_id, task.message_id)
        # Its own run's: another caller's letter under the id ended nothing of this one.
        for _, event in found.run_of(self._broker.names, task.caller):
            if event.event == "dead_lettered" or event.attempt > task.attempt:
                return True
            if event.attempt == task.attempt and event.event in ENDINGS:
                return True
        return False

    async def _end(self, task: Task, agent_id: str, error: ErrorInfo) -> None:
        log.warning("acknowledged without an outcome", error=error.message)
        await dead_letter(
            self._broker,
            reason=EXPIRED,
            message_id=task.message_id,
            trace_id=task.trace_id,
            topic=task.topic,
            error=error,
            caller=task.caller,
            ran=True,  # it may have: sent again under a new id, it could run twice
        )
        await reply(self._broker, task, error_reply(task, error, EXPIRED, ran=True))
        alert = agent_event(
            agent_id, "alert", problem=UNREPORTED, why=error.message, message_id=task.message_id
        )
        await emit(self._broker, alert)

    async def _since(self) -> int:
        """Where to start reading: the oldest open attempt the last holder knew of (when no
        holder stored one, ``lookback_s`` ago: the first start, or the mark lost)."""
        floor = now_ms() - int(self._config.lookback_s * 1000)
        try:
            entry = await (await self._marks()).get(MARK_KEY)
        except (BrokerError, DecodeError) as exc:
            log.warning("unreported attempts read from the lookback", error=str(exc))
            return floor
        return entry.value.since_ms if entry is not None else floor

    async def _mark(self) -> None:
        """Store when the oldest open attempt was routed (now, when none is open)."""
        since_ms = min((o.routed_ms for o in self._open.values()), default=now_ms())
        if since_ms == self._marked_ms:
            return
        await (await self._marks()).put(MARK_KEY, _Since(since_ms))
        self._marked_ms = since_ms

    async def _marks(self) -> Bucket[_Since]:
        return await self._broker.bucket(self._broker.names.leases_bucket, _Since)


def _ran_or_moved_on(records: list[Execution], task: Task, agent_id: str) -> bool:
    """Whether a record says the attempt is not one to end: it ran (``done``), its agent
    recorded its outcome (its report may still come), an expiry fence ended it already, it
    was taken from its agent (judged gone: its reassignment fence keeps the claim's lease,
    finished 0, and the next attempt may wait in intake for an agent), or a later attempt
    has a record."""
    if isinstance(verdict_of(records), RanAlready):
        return True
    return any(
        r.attempt > task.attempt
        or (r.attempt == task.attempt and r.agent_id == agent_id and r.finished_at_ms > 0)
        or (r.agent_id == agent_id and moved_on_from(r, task.attempt))
        for r in records
    )


async def _still_queued(broker: Broker, task: Task) -> bool:
    """Whether the attempt's dispatch is still in its agent's queue (a work queue keeps it
    until it is acknowledged); a queue longer than :data:`QUEUE_LOOKS` is taken as not."""
    stream = broker.names.dispatch_streams.get(task.priority)
    if stream is None or task.to_agent is None:
        return False
    subject = broker.names.dispatch(task.to_agent, task.priority)
    for stored in await messages_on(broker, stream, subject, limit=QUEUE_LOOKS):  # batched
        with contextlib.suppress(DecodeError):
            queued = decode_task(stored.data)
            if (queued.message_id, queued.attempt) == (task.message_id, task.attempt):
                return queued.caller == task.caller
    return False


def _unreported(found: _Open) -> str:
    """Why the attempt ends."""
    return (
        f"{found.agent_id} acknowledged attempt {found.routed.attempt} and never reported an"
        f" outcome: no completed, failed or expired within its ttl, its execute budget"
        f" ({found.dispatched.execute_ms} ms) and the coordinator's grace; it may have run in"
        " part (its payload was not kept)"
    )
