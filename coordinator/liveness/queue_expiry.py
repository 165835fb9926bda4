"""Tasks past their ttl in the queue of an agent that does not take them.

An agent checks a task's ttl when it fetches it, and the coordinator looks into an agent's
queues when the agent goes OFFLINE. Between the two, an agent that beats but does not
consume — its consumers gone after the server came back on an empty store, its fetch loop
stuck, a handler holding every place while more tasks queue behind what the agent holds —
would keep its queued tasks, and their senders waiting, until it stops. So the coordinator
looks for them itself: every ``every_s`` it goes over the queues that hold tasks (the
per-subject counts the queue-depth view reads anyway, no request of its own) and reads a
queue's messages (one batched direct get) only when something there may be due: a queue not
read yet, one that holds more than when it was read, one whose earliest deadline has come,
or one not read for ``reread_s``; at most ``reads`` queues a pass, the most overdue first.
A fleet of 100,000 agents costs no more than that.

A task whose ttl ran out ``grace_s`` ago, counted from the broker's timestamp of its dispatch
(the agent's own rule, plus a margin for the agent's clock), and that no agent runs or ran,
is ended as ``expired`` — dead letter, ``dead_lettered`` event, error reply — and removed
from the queue. The agent's own report of the same expiry ends nothing twice: both go
through the expiry fence (:mod:`agentreach.coordinator.delivery.expiry`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError
from agentreach.broker.direct import messages_on
from agentreach.broker.errors import pause
from agentreach.broker.streams import StoredMessage, delete_message
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.delivery.expiry import EXPIRED, fence_expiry
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing.run_once import (
    REASSIGNED,
    RanAlready,
    Running,
    RunOnce,
    began,
    lease_limit,
    verdict_of,
)
from agentreach.coordinator.units import NonNegativeSeconds, Positive, PositiveSeconds
from agentreach.envelopes import (
    DecodeError,
    ErrorInfo,
    Execution,
    Priority,
    Task,
    now_ms,
    ttl_passed_in_queue,
)
from agentreach.envelopes.server_answers import refuse_server_answers

log = structlog.get_logger("coordinator.queue_expiry")

READ_LIMIT = 1000  # messages of one queue read per look: one batch (P2's default capacity)


class QueueExpiryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How tasks past their ttl are found in the queues of agents that do not take them: a
    stuck agent's queued task ends within ``ttl + grace_s + every_s`` of its dispatch."""

    enabled: bool = True
    every_s: PositiveSeconds = 2.0  # how often the queues are gone over
    # Past the ttl, how long an agent has to take the task (or to report it expired) before
    # the coordinator ends it: the agent judges on its own clock, which may run behind.
    grace_s: NonNegativeSeconds = 2.0
    # After this replica's start, reconnect, or taking of the duty, and after JetStream did
    # not answer a pass, how long a task its agent took (a claim, its lease past) is left
    # before it counts as silent: no lease could be renewed while JetStream was away, and a
    # live agent reconnects and records the outcome it kept.
    reconnect_grace_s: NonNegativeSeconds = 30.0
    reads: Positive = 200  # queues read at most per pass
    reread_s: PositiveSeconds = 30.0  # a queue that holds tasks is read at least this often


class Queued(Protocol):
    """The queue depths as the coordinator reads them (``QueueDepths``)."""

    def slots(self) -> Iterable[tuple[str, Priority]]: ...

    def depth(self, agent_id: str, priority: Priority) -> int: ...


@dataclass(frozen=True, slots=True)
class _Look:
    """What the last read of one queue found."""

    at: float  # monotonic
    count: int  # messages it held
    due_ms: int  # when the earliest of them may be ended (0: none known to come due)


class QueueExpiry:
    """Ends the tasks that outlived their ttl in an agent's queue (:meth:`run`)."""

    def __init__(
        self,
        broker: Broker,
        config: QueueExpiryConfig,
        queued: Queued,
        grants: Grants | None = None,
    ) -> None:
        self._broker = broker
        self._config = config
        self._queued = queued
        self._grants = grants or Grants(None)
        self._run_once = RunOnce(broker, self._grants)
        self._looks: dict[tuple[str, Priority], _Look] = {}
        self.ended = 0  # tasks this replica ended so, since it started
        self._reconnects, self._heard_since = broker.reconnects, time.monotonic()

    async def run(self) -> None:
        """Go over the queues every ``every_s`` until cancelled."""
        if not self._config.enabled:
            return
        self._heard_since = time.monotonic()  # the duty taken (again): as a reconnect
        while True:
            await pause(self._config.every_s)  # the pass's own period
            if not self._broker.connected:
                continue
            try:
                await self.sweep()
            except BrokerError as exc:  # the next pass looks again
                log.warning("queues not gone over", error=str(exc))
                # JetStream away with the connection up (a lost majority): no agent could
                # record what it kept either, so the grace counts from when it answers.
                self._heard_since = time.monotonic()

    async def sweep(self) -> int:
        """One pass: read the queues that may hold a task due, end those; how many it ended."""
        ended = 0
        for agent_id, priority in self.due():
            ended += await self._look_into(agent_id, priority)
        self.ended += ended
        return ended

    def due(self) -> list[tuple[str, Priority]]:
        """The queues to read now, at most ``reads``, the most overdue first. A plain scan,
        no await per queue: it runs every pass over every queue that holds a task."""
        config, mono, now = self._config, time.monotonic(), now_ms()
        depth, looks, kept = self._queued.depth, self._looks, {}
        ranked: list[tuple[tuple[int, float], tuple[str, Priority]]] = []
        for slot in self._queued.slots():
            if (count := depth(slot[0], slot[1])) <= 0:
                continue
            if (look := looks.get(slot)) is None:
                ranked.append(((1, 0.0), slot))
                continue
            kept[slot] = look  # what no longer holds a task is forgotten
            if count > look.count:
                ranked.append(((1, look.at), slot))
            elif 0 < look.due_ms <= now:
                ranked.append(((0, look.due_ms), slot))
            elif mono - look.at >= config.reread_s:
                ranked.append(((2, look.at), slot))
        self._looks = kept
        return [slot for _, slot in heapq.nsmallest(config.reads, ranked)]

    async def _look_into(self, agent_id: str, priority: Priority) -> int:
        """Read one queue and end what is past its ttl and grace there."""
        names = self._broker.names
        stream, subject = names.dispatch_stream(priority), names.dispatch(agent_id, priority)
        stored = await messages_on(self._broker, stream, subject, limit=READ_LIMIT)
        grace_ms = int(self._config.grace_s * 1000)
        ended, left, due_ms = 0, 0, 0
        for message in stored:
            try:  # one without headers is a server's answer (no_hdr): nobody's to end
                refuse_server_answers(message.data, message.headers, subject, headed=True)
                task = envelopes.decode_task(message.data)
            except DecodeError:  # its agent's consumer dead-letters it as invalid_envelope
                left += 1
                continue
            deadline_ms = message.timestamp_ms + task.ttl_ms + grace_ms
            if deadline_ms > now_ms():
                again = deadline_ms
            else:
                again = await self._end(stream, message, task, agent_id)
            if again == "ended":
                ended += 1
            if not isinstance(again, int):
                continue
            left += 1
            due_ms = min(due_ms or again, again)
        self._looks[(agent_id, priority)] = _Look(time.monotonic(), left, due_ms)
        return ended

    async def _end(
        self, stream: str, message: StoredMessage, task: Task, agent_id: str
    ) -> Literal["ended", "removed"] | int:
        """End ``task`` as expired unless it ran, runs, or moved on: ``ended`` when this
        ended it, ``removed`` when its agent's report had (its queued copy is removed
        either way), else when to look at it again (ms since the epoch)."""
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, agent_id=agent_id
        ):
            records = await self._run_once.records(task)
            ttl_end_ms = message.timestamp_ms + task.ttl_ms  # a dispatch's ttl runs from it
            if (left_in := self._left_in_queue(records, task, agent_id, ttl_end_ms)) is not None:
                return left_in
            taken = began(records, agent_id, task.attempt)
            if taken and (grace_s := self._grace_left_s()) > 0:
                return now_ms() + int(grace_s * 1000) + 1  # its agent may be reconnecting
            why = _expired_with(task, agent_id, message.timestamp_ms, taken=taken)
            error = ErrorInfo(type=EXPIRED, message=why, retryable=False)
            seal = self._grants.seal(task.caller, task.message_id, task.attempt, agent_id)
            fenced = await fence_expiry(
                self._broker, task, agent_id, error, seal=seal, ttl_end_ms=ttl_end_ms
            )
            if fenced == "running":
                return self._later_ms()
            if fenced == "end":
                log.info("past its ttl in the queue of its agent", taken=taken)
                await end_with_error(self._broker, task, EXPIRED, error, started=taken)
            # Ended (here, or by its agent's report): the queued copy has nothing left to do.
            await delete_message(self._broker, stream, message.stream_seq)
            return "ended" if fenced == "end" else "removed"

    def _left_in_queue(
        self, records: list[Execution], task: Task, agent_id: str, ttl_end_ms: int
    ) -> int | None:
        """When to look again at a task that is not to be ended now, or None to end it: one
        that ran (its acknowledgement lost: its agent, or a reassignment, answers it), one a
        run holds, one whose attempt moved on (a later attempt, or a reassignment)."""
        if any(_moved_on(r, task, agent_id) for r in records):
            return self._later_ms()
        match verdict_of(records, until_ms=lease_limit(task, ttl_end_ms)):
            case RanAlready():
                return self._later_ms()
            case Running(left_s=left_s):
                return now_ms() + int(left_s * 1000) + 1
        return None

    def _grace_left_s(self) -> float:
        """What is left of the grace after this replica's start or last reconnect."""
        if (reconnects := self._broker.reconnects) != self._reconnects:
            self._reconnects, self._heard_since = reconnects, time.monotonic()
        return self._config.reconnect_grace_s - (time.monotonic() - self._heard_since)

    def _later_ms(self) -> int:
        return now_ms() + int(self._config.reread_s * 1000)


def _expired_with(task: Task, agent_id: str, dispatched_ms: int, *, taken: bool) -> str:
    """Why the queued attempt ends: it waited past its ttl untaken, or its agent ``taken`` it
    (a claim of this attempt) and went silent, its run's lease past (an accepted task is not
    one that never started: the handler may have done part of its work)."""
    said = ttl_passed_in_queue(
        task.ttl_ms, agent_id, dispatched_ms=dispatched_ms, received_ms=task.received_ms
    )
    if taken:
        return (
            f"{said}, which took it and went silent (its run's lease ran out): it may have"
            " run in part"
        )
    return f"{said}, which did not take it"


def _moved_on(record: Execution, task: Task, agent_id: str) -> bool:
    """Whether ``record`` says the queued attempt is no longer the task's to end: a later
    attempt has a record, or this one was taken from its agent (reassigned after OFFLINE)."""
    if record.attempt > task.attempt:
        return True
    return (
        record.attempt == task.attempt
        and record.agent_id == agent_id
        and record.state == "failed"
        and record.error is not None
        and record.error.type == REASSIGNED
    )
