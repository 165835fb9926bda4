"""An agent went OFFLINE (or was forgotten): its unfinished tasks go to another agent, fenced
from the old one. What was dispatched to it and not acknowledged is still in its dispatch
subjects (work-queue streams keep a message until it is acknowledged). Each is dispatched
again with the same message_id and attempt + 1. Before that, its execution record is marked
failed: a late ``finish`` from the old agent then loses the conditional write, and its
result is rejected.

An attempt its agent never claimed did not run, and one its agent's clean stop cut short
failed for the stop: both count in the task's ``requeued``, not in the topic's attempts (a
rolling restart must not use them up). One its agent was running when it died does count:
a task that kills every agent that runs it ends as ``retries_exhausted`` after the topic's
attempts, instead of taking down agent after agent until its ttl runs out. An agent that
stopped answering (SUSPECT ``unresponsive``) loses what it never claimed, at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Literal

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, WrongLastSequence
from agentreach.broker.dead_letters import dead_letter_stored
from agentreach.broker.lifecycle import SEAL_HEADER
from agentreach.broker.streams import StoredMessage, delete_message, next_message, stream_bounds
from agentreach.coordinator.liveness.forward import (
    Allowed,
    Gone,
    default_allowed,
    forward,
)
from agentreach.coordinator.liveness.tracked import Registered, Tracked, untrack
from agentreach.coordinator.routing.run_once import REASSIGNED, RunOnce
from agentreach.envelopes import (
    INVALID_TOPIC,
    AgentCard,
    DecodeError,
    ErrorInfo,
    Execution,
    Task,
    execution_key,
    is_expiry_fence,
    now_ms,
)
from agentreach.envelopes.server_answers import refuse_server_answers

log = structlog.get_logger("coordinator.reassign")
Queued = Callable[[], Iterable[tuple[str, str]]]  # (agent, priority) with tasks queued

OFFLINE = "went OFFLINE"
DRAINING = "began to stop"  # its card says draining: it finishes what it runs, nothing more
UNRESPONSIVE = "stopped answering"  # SUSPECT `unresponsive`: what it runs stays, as DRAINING
FORGOTTEN = "is no longer registered (forgotten: reach agents forget)"
NEWER_LOOK_EVERY = 20  # queued tasks between two looks for a newer process of the agent


class Moves:
    """The reassignments of gone agents' queues, each tried again at every sweep until it
    went through: a refused write (a full intake subject, a failover's timeout) must not
    leave tasks to an agent that is gone, nor end the sweep that judges every agent."""

    def __init__(
        self,
        broker: Broker,
        run_once: RunOnce,
        *,
        judged: dict[str, Tracked] | None = None,
        registered: Registered | None = None,
        queued: Queued | None = None,
        allowed: Allowed | None = None,
    ) -> None:
        self._broker = broker
        self._run_once = run_once
        self._allowed = allowed
        self._unmoved: dict[str, tuple[int, str]] = {}  # agent id → the epoch gone, and why
        self._judged = judged if judged is not None else {}
        self._registered = registered
        self._queued = queued
        self._drained: set[tuple[str, int]] = set()  # (agent, epoch) whose queue moved
        self._moving = asyncio.Lock()  # one move at a time: two would judge one message

    @property
    def unmoved(self) -> frozenset[str]:
        return frozenset(self._unmoved)

    async def move(self, agent_id: str, epoch: int, *, why: str = OFFLINE) -> None:
        """Reassign ``agent_id``'s queued tasks now, or at a later :meth:`retry`; ``why``
        it lost them ends the sentence "``agent_id`` …" in their traces."""
        self._unmoved[agent_id] = (epoch, why)
        await self._try(agent_id)

    async def retry(self, still_gone: Callable[[str], bool]) -> None:
        """Try the reassignments that failed again, of the agents still gone."""
        for agent_id in list(self._unmoved):
            if still_gone(agent_id):
                await self._try(agent_id)
            else:  # back: its own consumer takes its queue again
                self._unmoved.pop(agent_id, None)

    async def sweep(self) -> None:
        """Retry what did not move, of agents still gone; then move every queue left to an
        agent nobody knows any more: forgotten by an operator (no card, no verdict), here or
        while no coordinator ran. Nothing else would ever take those tasks."""
        await self.retry(self.gone)
        await self._move_draining()
        queued = {agent for agent, _ in self._queued()} if self._queued is not None else set()
        for agent_id in sorted(queued - self._unmoved.keys()):
            if agent_id not in self._judged and self.gone(agent_id):
                await self.move(agent_id, 0, why=FORGOTTEN)

    async def _move_draining(self) -> None:
        """Move what waits in the queue of an agent that began to stop (card ``draining``)
        once: it finishes what it runs and takes nothing more, and the rest would wait for
        its whole drain. What it runs stays (see :func:`_fence`)."""
        cards = self._registered.cards.values() if self._registered is not None else ()
        draining = {(c.agent_id, c.epoch) for c in cards if c.status == "draining"}
        self._drained &= draining
        for agent_id, epoch in sorted(draining - self._drained):
            self._drained.add((agent_id, epoch))
            try:
                await self._reassign(agent_id, epoch, DRAINING)
            except BrokerError as exc:  # what is left moves when it stops
                log.warning("queued tasks of a stopping agent not moved", agent_id=agent_id,
                            error=str(exc))  # fmt: skip

    def forget(self, agent_id: str) -> None:
        """An operator forgot the agent: it is judged no more, and the next :meth:`sweep`
        moves what is still queued for it."""
        untrack(self._judged, agent_id)

    def gone(self, agent_id: str) -> bool:
        """Whether ``agent_id``'s queue is nobody's: it is judged OFFLINE, or it is neither
        judged nor registered (forgotten). A card written a moment ago that this view has
        not seen yet is read again before anything moves (:func:`reassign_tasks`)."""
        if (tracked := self._judged.get(agent_id)) is not None:
            return tracked.state == "OFFLINE"
        return self._registered is not None and agent_id not in self._registered.cards

    async def _try(self, agent_id: str) -> None:
        epoch, why = self._unmoved[agent_id]
        try:
            await self._reassign(agent_id, epoch, why)
        except BrokerError as exc:
            log.warning("queued tasks not moved yet", agent_id=agent_id, error=str(exc))
            return
        self._unmoved.pop(agent_id, None)

    async def _reassign(self, agent_id: str, epoch: int, why: str) -> None:
        async with self._moving:
            await reassign_tasks(
                self._broker,
                agent_id,
                epoch=epoch,
                run_once=self._run_once,
                why=why,
                allowed=self._allowed,
            )


async def reassign_tasks(
    broker: Broker,
    agent_id: str,
    *,
    epoch: int = 0,
    run_once: RunOnce | None = None,
    why: str = OFFLINE,
    allowed: Allowed | None = None,
) -> int:
    """Re-dispatch every task waiting for ``agent_id``, whose process ``epoch`` is gone
    (``why``: it went OFFLINE, or was forgotten); returns how many it took away (sent on, or
    ended where their ttl had passed or their attempts ran out). Nothing moves when a newer
    process of the agent is up already: its consumer (the same durable) takes those tasks
    itself. ``run_once`` reads the records (sealed ones, when secured); ``allowed`` says how
    many attempts a task gets (by default the coordinator's default settings)."""
    run_once = run_once or RunOnce(broker)
    gone = Gone(agent_id, epoch, why, allowed or default_allowed)
    streams = broker.names.dispatch_streams
    held = {stream: (await stream_bounds(broker, stream))[1] for stream in streams.values()}
    if await _newer_process(broker, agent_id, epoch):
        log.info("a newer process serves the agent; nothing to reassign", agent_id=agent_id)
        return 0
    taken: Counter[str] = Counter()
    looked = 0
    for priority, stream in streams.items():
        subject = broker.names.dispatch(agent_id, priority)
        seq = 1
        while (stored := await next_message(broker, stream, subject, from_seq=seq)) is not None:
            # Asked again as the queue is gone through: a process started meanwhile gets its
            # tasks in this very queue, and moving them sent each to and fro, one attempt
            # after another (a walkthrough: attempt 9, three completions). A dispatch stored
            # since the move began was routed here by a router that took the agent for live:
            # asked at each (a stop's move sent a task routed to the next process on twice).
            looked += 1
            asks = looked % NEWER_LOOK_EVERY == 0 or stored.stream_seq > held[stream]
            if asks and await _newer_process(broker, agent_id, epoch):
                log.info("a newer process serves the agent; the rest is its", agent_id=agent_id)
                return _said(agent_id, taken)
            seq = stored.stream_seq + 1
            what = await _move(broker, stream, stored, gone, run_once)
            if what == "kept":
                continue
            if what is not None:
                taken[what] += 1
            await delete_message(broker, stream, stored.stream_seq)
    return _said(agent_id, taken)


def _said(agent_id: str, taken: Counter[str]) -> int:
    if taken:
        log.info("tasks taken from the agent", agent_id=agent_id, **taken)
    return taken.total()


async def _newer_process(broker: Broker, agent_id: str, epoch: int) -> bool:
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    card = await cards.get(agent_id)
    return card is not None and card.value.status == "running" and card.value.epoch > epoch


async def _move(
    broker: Broker, stream: str, stored: StoredMessage, gone: Gone, run_once: RunOnce
) -> Literal["reassigned", "past_ttl", "kept", "unreadable", "exhausted", "ended"] | None:
    """Send the task through intake again as its next attempt, with the ttl it has left
    (not the router: when no agent can take it now it waits there, not lost with this call)."""
    agent_id, epoch, why, _ = gone
    try:  # a dispatch has headers: one without is a server's answer (no_hdr), nobody's
        refuse_server_answers(stored.data, stored.headers, stored.subject, headed=True)
        task = envelopes.decode_task(stored.data)
        run_once.vouch(task, agent_id, stored.headers)
    except DecodeError as exc:  # its agent's consumer would have dead-lettered it
        said = f"a dispatch to {agent_id}, which {why}, is no task: {exc}"
        error = ErrorInfo(type="invalid_envelope", message=said, retryable=False)
        await dead_letter_stored(
            broker, stream, stored, reason="invalid_envelope", error=error, topic=INVALID_TOPIC
        )
        return "unreadable"
    ran = await _fence(broker, task, agent_id, epoch, why, seal=stored.headers.get(SEAL_HEADER))
    if ran is None:
        return "kept"
    if ran == "ended":  # its dispatch is what is left of a message that has ended
        return "ended"
    return await forward(broker, task, gone, run_once, ran=ran, dispatched_ms=stored.timestamp_ms)


async def _fence(
    broker: Broker, task: Task, agent_id: str, epoch: int, why: str, *, seal: str | None
) -> bool | Literal["ended"] | None:
    """Take the attempt away from the gone process (that agent, that epoch or older): a
    running claim, so its late result cannot land; or, never claimed, a fence for the
    attempt, so that a process of the agent that comes back and fetches it from its durable
    queue before it is deleted here does not run it beside the next attempt (it ran twice
    in the chaos suite). A claim of anyone else stands, and so does a result; a run of a newer
    process of the agent is kept (None), as it would be sent on beside it. False when
    the attempt never ran: it was not claimed. From a DRAINING or UNRESPONSIVE agent only
    what it never claimed is taken: None when it runs the attempt (claimed, or claiming).
    ``ended``: the attempt was ended as expired, unreported in time (its agent paused, say),
    and dead-lettered; sent on, it ran again and ended twice."""
    executions = await broker.bucket(broker.names.executions_bucket, Execution)
    reassigned = ErrorInfo(type=REASSIGNED, message=f"its agent {why}", retryable=True)
    unclaimed, draining, running, ended = False, why in (DRAINING, UNRESPONSIVE), False, False

    def fenced(record: Execution | None) -> Execution | None:
        nonlocal unclaimed, running, ended
        if record is not None and is_expiry_fence(record, task.attempt):
            ended = True
            return None
        if draining and record is not None and record.state == "running":
            running = True  # its stop lets it finish
            return None
        # A fence written before (a move tried again): claimed, it would say when it began.
        unclaimed = record is None or (
            envelopes.is_reassignment_fence(record, task.attempt) and not record.started_ms
        )
        if record is None or (record.state == "failed" and record.attempt < task.attempt):
            unclaimed = True
            return Execution(
                message_id=task.message_id,
                state="failed",
                agent_id=agent_id,
                epoch=epoch,
                attempt=task.attempt,
                error=reassigned,
                finished_at_ms=now_ms(),
                caller=task.caller,
                seal=seal,
            )
        if record.state != "running" or record.agent_id != agent_id:
            return None
        if epoch and record.epoch > epoch:
            running = True  # a newer process of the agent runs it: its own, kept
            return None
        return msgspec.structs.replace(record, state="failed", error=reassigned)

    # Losing this race means it finished just now: the next attempt finds the stored result.
    key = execution_key(task.caller, task.message_id, agent_id)
    try:
        await executions.cas(key, fenced, tries=1)
    except WrongLastSequence:
        return None if draining else True
    if ended:
        return "ended"
    return None if running else not unclaimed
