"""What an agent says about a task it executes: the ack, progress and result to the sender's
``reply_to``, and the lifecycle events (``accepted``, ``progress``, ``completed``, ``failed``,
``expired`` …) to the coordinator, each carrying back the grant of its dispatch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.agents.claims import Outcome
from agentreach.agents.job import Job
from agentreach.broker import Broker, BrokerError, Delivery
from agentreach.broker.dead_letters import reported_raw
from agentreach.broker.lifecycle import about, emit, event_for, reply
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import (
    Ack,
    Capacity,
    DecodeError,
    ErrorInfo,
    PayloadRef,
    Progress,
    Result,
    Task,
    now_ms,
)
from agentreach.logs import get_logger

log = get_logger("agents")

# How long a handler waits on one progress report: a server away must not hold it (each
# report waited out the publish's retries: a 3 s job took 24 s, another ran past its budget).
PROGRESS_WAIT_S = 1.0


class Reports:
    """The reports of one agent process, sent as ``agent_id``."""

    def __init__(self, broker: Broker, agent_id: str) -> None:
        self.broker = broker
        self._me = agent_id
        # message_id → at_ms of its last progress event: progress events carry no dedup id,
        # and a rising at_ms keeps two reports within one millisecond in order.
        self._progress_at: dict[str, int] = {}

    async def accept(self, job: Job, capacity: Capacity, epoch: int) -> None:
        """The ack to the sender, and ``accepted`` (with the broker time of the dispatch and
        this process's epoch) to all."""
        task = job.task
        ack = Ack(**self._about(task), capacity=capacity)
        try:  # the reply does not wait (core NATS): both leave in one write
            await reply(self.broker, task, ack, sender=self._me)
        finally:  # the event goes even when the reply could not
            await self.say(job, "accepted", dispatched_at_ms=job.dispatched_ms, epoch=epoch)

    async def progress(self, job: Job, note: str) -> None:
        task = job.task
        progress = Progress(**self._about(task), note=note)
        at_ms = max(now_ms(), self._progress_at.get(task.message_id, 0) + 1)
        self._progress_at[task.message_id] = at_ms
        said = await asyncio.gather(
            job.delivery.in_progress(),
            reply(self.broker, task, progress, sender=self._me),
            self.say(job, "progress", at_ms=at_ms, note=note),
            return_exceptions=True,
        )
        # A report is news, not work: a server away for a moment must not fail the handler
        # (its work would be done again), which goes on and records its outcome when it can.
        for failure in (outcome for outcome in said if isinstance(outcome, BaseException)):
            if not isinstance(failure, BrokerError):
                raise failure
            log.warning("progress not reported", error=str(failure))

    def forget(self, message_id: str) -> None:
        """The task's run ended: its progress order is kept no longer."""
        self._progress_at.pop(message_id, None)

    async def complete(
        self,
        job: Job,
        result: Any,
        duration_ms: int,
        *,
        ref: PayloadRef | None = None,
        past_deadline_ms: int | None = None,
    ) -> None:
        """Answer the sender, then tell the coordinator (the result is already recorded);
        ``past_deadline_ms``: the deadline a run that could not be stopped went past."""
        answer = Result(**self._about(job.task), result=result, result_ref=ref)
        await reply(self.broker, job.task, answer, sender=self._me)
        shown = {"result_ref": msgspec.to_builtins(ref)} if ref else {"result": result}
        if past_deadline_ms is not None:
            shown["past_deadline_ms"] = past_deadline_ms
        await self.say(job, "completed", duration_ms=duration_ms, **shown)

    async def complete_run(self, job: Job, outcome: Outcome) -> None:
        """:meth:`complete`, with what a run of the handler ended with."""
        await self.complete(
            job,
            outcome.result,
            outcome.duration_ms,
            ref=outcome.result_ref,
            past_deadline_ms=outcome.past_deadline_ms,
        )

    async def report(self, job: Job, event: str, error: ErrorInfo) -> None:
        """Tell the coordinator, which decides between retry and dead letter."""
        detail = {"task": job.task, "error": error, "dispatched_at_ms": job.dispatched_ms}
        await self.say(job, event, **detail)

    async def say(self, job: Job, event: str, *, at_ms: int = 0, **detail: Any) -> None:
        """An event about the job, as this agent, carrying the coordinator's grant back
        (``at_ms``, when given, replaces the publisher's clock: progress keeps it rising)."""
        if job.grant:
            detail["grant"] = job.grant
        said = event_for(job.task, event, agent_id=self._me, **detail)
        if at_ms:
            said = msgspec.structs.replace(said, at_ms=at_ms)
        await emit(self.broker, said, sender=self._me)

    async def undecodable(self, delivery: Delivery, exc: DecodeError) -> None:
        """A dispatch that is not a task: the coordinator dead-letters it, from our report."""
        log.warning("undecodable dispatch", subject=delivery.subject, error=str(exc))
        message_id = envelopes.stable_id(
            delivery.timestamp_ns, delivery.stream, delivery.stream_seq
        )
        stub = Task(v=1, message_id=message_id, trace_id=message_id, topic=envelopes.INVALID_TOPIC)
        event = event_for(
            stub,
            "failed",
            agent_id=self._me,
            error=ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False),
            **reported_raw(delivery.data),
            headers=dict(delivery.headers),
        )
        await emit(self.broker, event, sender=self._me)

    def _about(self, task: Task) -> dict[str, Any]:
        """An agent's answer: from this agent, to the task's sender."""
        return about(task, from_agent=self._me, to_agent=task.from_agent)


class Progressing:
    """One run's progress reports (``report``: publish it, renew the claim): each waited for
    at most :data:`PROGRESS_WAIT_S`, then left to finish in the background, one at a time
    (a report made while the one before is still on its way is not made); cut at the run's
    end (:meth:`close`), and none made after it, nor once the run lost its claim (:meth:`end`):
    a trace showed progress after the end (a handler's task left running, a paused process
    that came back after a newer one had completed its task)."""

    def __init__(self, report: Callable[[str], Awaitable[None]]) -> None:
        self._report = report
        self._on_its_way: asyncio.Task[None] | None = None
        self._ended = False

    async def say(self, note: str) -> None:
        if self._ended:
            return  # nobody waits for this run's progress any more
        if self._on_its_way is not None and not self._on_its_way.done():
            return  # the server is slow or away: the one before has not arrived yet
        self._on_its_way = on_its_way = asyncio.create_task(self._report(note))
        await asyncio.wait({on_its_way}, timeout=PROGRESS_WAIT_S)
        if on_its_way.done():
            on_its_way.result()  # a failure of its own (not the broker's) is the handler's
        else:
            log.warning("progress not reported yet; the handler goes on", wait_s=PROGRESS_WAIT_S)

    @property
    def ended(self) -> bool:
        """Whether reports are no longer made."""
        return self._ended

    def end(self) -> None:
        """Make no report from now on."""
        self._ended = True

    async def close(self) -> None:
        self.end()
        if self._on_its_way is not None:
            await cancel_and_wait(self._on_its_way)
