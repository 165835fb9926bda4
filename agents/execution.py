"""Executing one dispatched task, from receipt to result: decode, check the ttl, claim it
(run once), accept it, run the handler within its deadline, record and report the outcome.

Every outcome is reported to the coordinator as an event (``completed``, ``failed``,
``expired``), which decides between a retry and a dead letter; the sender gets its
``ack``, ``progress`` and ``result`` on its ``reply_to``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from agentreach import envelopes
from agentreach.agents.claims import AlreadyDone, Busy, Claimed, Claims, Outcome
from agentreach.agents.context import TaskContext
from agentreach.agents.deadline import LEASE_GRACE_MS, Deadline
from agentreach.agents.errors import PermanentError
from agentreach.broker import Broker, BrokerError, Delivery
from agentreach.broker.lifecycle import about, dead_letter_delivery, emit, event_for, reply
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import (
    Ack,
    Capacity,
    DecodeError,
    ErrorInfo,
    Progress,
    Result,
    Task,
    now_ms,
    ttl_left_ms,
)
from agentreach.envelopes.headers import task_headers

if TYPE_CHECKING:
    from agentreach.agents.agent import Agent, HandlerSpec

log = structlog.get_logger("agents")

BUSY_POLL_S = 0.5
UNDECODABLE_TOPIC = "_invalid"


class LatencyEstimate:
    """A moving average of handler latency, for the capacity an ``ack`` advertises."""

    def __init__(self, weight: float = 0.2) -> None:
        self._weight = weight
        self._average: float | None = None

    @property
    def estimate_ms(self) -> int:
        return int(self._average or 0)

    def observe(self, duration_ms: int) -> None:
        if self._average is None:
            self._average = float(duration_ms)
        else:
            self._average += self._weight * (duration_ms - self._average)


class Executor:
    """Runs the deliveries of one agent process; ``free_slots`` tells an ack what is left."""

    def __init__(
        self,
        agent: Agent,
        broker: Broker,
        claims: Claims,
        *,
        free_slots: Callable[[Task], int],
    ) -> None:
        self.agent = agent
        self.broker = broker
        self.latency = LatencyEstimate()
        self._claims = claims
        self._free_slots = free_slots
        # message_id → at_ms of its last progress event: the event's dedup id ends with it,
        # so two reports within one millisecond must still differ.
        self._progress_at: dict[str, int] = {}

    async def settle(self, delivery: Delivery) -> None:
        """Execute the delivery, then acknowledge it, or hand it back to come again later."""
        try:
            task = envelopes.decode_task(delivery.data)
        except DecodeError as exc:
            await self._undecodable(delivery, exc)
            await delivery.ack()
            return
        try:
            with structlog.contextvars.bound_contextvars(
                message_id=task.message_id, trace_id=task.trace_id, agent_id=self.agent.agent_id
            ):
                retry_in_s = await self._execute(delivery, task)
        except BrokerError as exc:
            log.warning("could not report task outcome, will see it again", error=str(exc))
            retry_in_s = 1.0
        if retry_in_s is None:
            await delivery.ack()
        else:
            await delivery.nak(retry_in_s)

    async def _execute(self, delivery: Delivery, task: Task) -> float | None:
        """Run ``task`` at most once; returns when to see it again, or None when done."""
        dispatched_ms = delivery.timestamp_ms
        if (kept := self._claims.unrecorded(task.message_id)) is not None:
            log.info("answering a redelivery from an outcome not yet recorded")
            await self._conclude(delivery, task, kept, dispatched_ms)
            return None
        spec = self.agent.handlers.get(task.topic)
        if spec is None:
            message = f"{self.agent.agent_id} does not serve {task.topic!r}"
            error = ErrorInfo(type="no_handler", message=message, retryable=False)
            await self._report(task, "failed", error, dispatched_ms)
            return None
        if ttl_left_ms(task.ttl_ms, dispatched_ms) <= 0:
            message = f"ttl {task.ttl_ms} ms passed in the queue of {self.agent.agent_id}"
            error = ErrorInfo(type="expired", message=message, retryable=False)
            await self._report(task, "expired", error, dispatched_ms)
            return None
        window_ms = min(spec.deadline_ms or task.budget.execute_ms, task.budget.execute_ms)
        # Acknowledging while claiming saves a round trip; a duplicate that turns out
        # to be done already acknowledges, then answers with the stored result.
        claim, _ = await asyncio.gather(
            self._claim(delivery, task, lease_ms=window_ms + LEASE_GRACE_MS),
            self._accept(task),
        )
        if isinstance(claim, AlreadyDone):
            log.info("already executed; sending the stored result again")
            await self._complete(task, claim.record.result, duration_ms=0)
            return None
        await self._run(delivery, task, spec, claim, dispatched_ms)
        return None

    async def _run(
        self,
        delivery: Delivery,
        task: Task,
        spec: HandlerSpec,
        claim: Claimed,
        dispatched_ms: int,
    ) -> None:
        deadline = Deadline(budget_ms=task.budget.execute_ms, window_ms=spec.deadline_ms)

        async def progressed(note: str) -> None:
            await self._progress(delivery, task, note)
            if deadline.extend() and not await self._claims.renew(task, claim, deadline.lease_ms()):
                log.warning("claim lost while running: this run's result will be refused")

        ctx = TaskContext(
            task,
            agent_id=self.agent.agent_id,
            deadline=deadline,
            report_progress=progressed,
            submit=self._submit,
            loop=asyncio.get_running_loop(),
        )
        started = time.monotonic()
        # A handler longer than the ack wait would be redelivered (and count towards
        # max_deliver) although it runs: tell the server it is still being worked on.
        keepalive = asyncio.create_task(_keep_alive(delivery, self.agent.ack_wait / 2))
        try:
            result = await _call(spec, ctx, task.payload, deadline)
        except Exception as exc:  # every handler failure is reported, none is lost
            outcome = Outcome(claim, error=_error_info(exc, deadline.total_ms))
        else:
            duration_ms = int((time.monotonic() - started) * 1000)
            self.latency.observe(duration_ms)
            outcome = Outcome(claim, result=result, duration_ms=duration_ms)
        finally:
            await cancel_and_wait(keepalive)
            self._progress_at.pop(task.message_id, None)
        await self._conclude(delivery, task, outcome, dispatched_ms)

    async def _conclude(
        self, delivery: Delivery, task: Task, outcome: Outcome, dispatched_ms: int
    ) -> None:
        """Record the outcome (it survives a broker outage meanwhile), then report it."""
        recorded = await self._claims.record(task, outcome, still_working=delivery.in_progress)
        if outcome.error is not None:
            error = outcome.error
            log.info("handler failed", error_type=error.type, error=error.message)
            await self._report(task, "failed", error, dispatched_ms)
            return
        if not recorded:
            # Fenced: the task was reassigned while this ran; the new attempt answers.
            log.warning("late result rejected: the task was reassigned")
            rejected = event_for(task, "late_result_rejected", agent_id=self.agent.agent_id)
            await emit(self.broker, rejected)
            return
        await self._complete(task, outcome.result, outcome.duration_ms)

    async def _claim(
        self, delivery: Delivery, task: Task, *, lease_ms: int
    ) -> Claimed | AlreadyDone:
        """Claim the message, waiting here while another delivery holds it.

        The wait is not a redelivery: a duplicate that came back through nak would
        count towards max_deliver and could dead-letter a message that completes.
        """
        while True:
            claim = await self._claims.claim(task, lease_ms=lease_ms)
            if not isinstance(claim, Busy):
                return claim
            log.info("another delivery holds this message", retry_in_s=claim.retry_in_s)
            await delivery.in_progress()
            await asyncio.sleep(min(claim.retry_in_s, BUSY_POLL_S))

    async def _submit(self, task: Task) -> None:
        subject = self.broker.names.task(task.topic)
        await self.broker.publish(subject, envelopes.encode(task), headers=task_headers(task))

    async def _accept(self, task: Task) -> None:
        capacity = Capacity(
            free_slots=self._free_slots(task), est_latency_ms=self.latency.estimate_ms
        )
        ack = Ack(**self._about(task), capacity=capacity)
        await asyncio.gather(
            reply(self.broker, task, ack),
            emit(self.broker, event_for(task, "accepted", agent_id=self.agent.agent_id)),
        )

    async def _progress(self, delivery: Delivery, task: Task, note: str) -> None:
        event = event_for(task, "progress", agent_id=self.agent.agent_id, note=note)
        at_ms = max(now_ms(), self._progress_at.get(task.message_id, 0) + 1)
        self._progress_at[task.message_id] = at_ms
        await asyncio.gather(
            delivery.in_progress(),
            reply(self.broker, task, Progress(**self._about(task), note=note)),
            emit(self.broker, msgspec.structs.replace(event, at_ms=at_ms)),
        )

    async def _complete(self, task: Task, result: Any, duration_ms: int) -> None:
        """Answer the sender, then tell the coordinator (the result is already recorded)."""
        await reply(self.broker, task, Result(**self._about(task), result=result))
        completed = event_for(
            task, "completed", agent_id=self.agent.agent_id, result=result, duration_ms=duration_ms
        )
        await emit(self.broker, completed)

    async def _report(self, task: Task, event: str, error: ErrorInfo, dispatched_ms: int) -> None:
        """Tell the coordinator, which decides between retry and dead letter."""
        detail = {"task": task, "error": error, "dispatched_at_ms": dispatched_ms}
        await emit(self.broker, event_for(task, event, agent_id=self.agent.agent_id, **detail))

    async def _undecodable(self, delivery: Delivery, exc: DecodeError) -> None:
        log.warning("undecodable dispatch", subject=delivery.subject, error=str(exc))
        error = ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False)
        await dead_letter_delivery(
            self.broker, delivery, reason="invalid_envelope", error=error, topic=UNDECODABLE_TOPIC
        )

    def _about(self, task: Task) -> dict[str, Any]:
        """An agent's answer: from this agent, to the task's sender."""
        return about(task, from_agent=self.agent.agent_id, to_agent=task.from_agent)


async def _keep_alive(delivery: Delivery, every_s: float) -> None:
    while True:
        await asyncio.sleep(max(0.1, every_s))  # the keep-alive's own period
        with contextlib.suppress(BrokerError):  # the next one may get through
            await delivery.in_progress()


async def _call(spec: HandlerSpec, ctx: TaskContext, payload: Any, deadline: Deadline) -> Any:
    async with asyncio.timeout(None) as scope:
        deadline.enforce(scope)
        if spec.is_async:
            return await spec.func(ctx, payload)
        # A thread cannot be cancelled: past the deadline its late result is discarded.
        return await asyncio.to_thread(spec.func, ctx, payload)


def _error_info(exc: Exception, deadline_ms: int) -> ErrorInfo:
    if isinstance(exc, TimeoutError):
        return ErrorInfo(
            type="deadline_exceeded", message=f"handler ran past {deadline_ms} ms", retryable=True
        )
    return ErrorInfo(
        type=type(exc).__name__,
        message=str(exc) or type(exc).__name__,
        retryable=not isinstance(exc, PermanentError),
    )
