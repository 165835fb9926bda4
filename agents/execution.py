"""Executing one dispatched task, from receipt to result: decode, check the ttl, claim it
(run once), accept it, run the handler within its deadline, record and report the outcome.

Every outcome is reported to the coordinator as an event (``completed``, ``failed``,
``expired``), which decides between a retry and a dead letter; the sender gets its
``ack``, ``progress`` and ``result`` on its ``reply_to``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from agentreach import envelopes
from agentreach.agents.claims import (
    BUSY_POLL_S,
    AlreadyDone,
    AlreadyFailed,
    Claimed,
    Claims,
    Expired,
    Hand,
    Moved,
    Outcome,
)
from agentreach.agents.client import ReachClient
from agentreach.agents.context import TaskContext
from agentreach.agents.deadline import LEASE_GRACE_MS, Deadline
from agentreach.agents.errors import PermanentError
from agentreach.agents.failures import failed, spent, unrecordable
from agentreach.agents.handlers import (
    DeadlinePassed,
    InvalidPayload,
    call,
    error_info,
    failed_on_null,
    sendable,
    typed,
)
from agentreach.agents.job import Job
from agentreach.agents.reports import Progressing, Reports
from agentreach.agents.slots import Latencies, Room
from agentreach.broker import (
    Broker,
    BrokerError,
    ClaimCheck,
    Delivery,
    PayloadUnavailable,
    TooLarge,
    ValueTooLarge,
)
from agentreach.envelopes import (
    Capacity,
    DecodeError,
    ErrorInfo,
    Task,
    now_ms,
    refuse_server_answers,
    ttl_left_ms,
    ttl_passed_in_queue,
)
from agentreach.envelopes.headers import task_headers
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.agents.agent import Agent, HandlerSpec

log = get_logger("agents")


class _Elsewhere(enum.Enum):
    ELSEWHERE = "elsewhere"


# Another delivery of the message holds its claim and runs it: neither ack nor nak this one.
ELSEWHERE = _Elsewhere.ELSEWHERE


class Executor:
    """Runs the deliveries of one agent process, each in the ``room`` it takes (a place of
    its handler, a slot of its priority) from its acceptance to its handler's outcome:
    recording and reporting the outcome hold neither."""

    def __init__(
        self,
        agent: Agent,
        broker: Broker,
        claims: Claims,
        *,
        room: Room,
        claim_check: ClaimCheck | None = None,
    ) -> None:
        self.agent = agent
        self.broker = broker
        self.claim_check = claim_check or ClaimCheck(broker)
        self.latency = Latencies()
        self._claims = claims
        self._room = room
        self._reports = Reports(broker, agent.agent_id)
        # Sub-tasks a handler waits for (ctx.invoke) are sent as this agent, a caller.
        self._client = ReachClient(broker=broker, name=agent.agent_id)

    @property
    def _me(self) -> str:
        return self.agent.agent_id

    async def settle(self, delivery: Delivery) -> None:
        """Execute the delivery, then acknowledge it, or hand it back to come again later."""
        try:
            # A direct get's answer aimed here is a stored message of someone's: no dispatch.
            refuse_server_answers(delivery.data, delivery.headers, delivery.subject, headed=True)
            task = envelopes.decode_task(delivery.data)
        except DecodeError as exc:
            await self._reports.undecodable(delivery, exc)
            await delivery.ack()
            return
        try:
            with structlog.contextvars.bound_contextvars(
                message_id=task.message_id, trace_id=task.trace_id, agent_id=self._me
            ):
                retry_in_s = await self._execute(Job(delivery, task))
        except BrokerError as exc:
            log.warning("task not settled (the server away?): it comes back", error=str(exc))
            retry_in_s = 1.0
        if retry_in_s is ELSEWHERE:
            return  # its ack is the other delivery's to give
        if retry_in_s is None:
            await delivery.ack()
        else:
            await delivery.nak(retry_in_s)

    async def _execute(self, job: Job) -> float | _Elsewhere | None:
        """Run the task at most once; returns when to see it again, None when done, or
        ELSEWHERE when another delivery of the message holds its claim."""
        task = job.task
        spec = self.agent.handlers.get(task.topic)
        if spec is None:
            message = f"{self._me} does not serve {task.topic!r}"
            error = ErrorInfo(type="no_handler", message=message, retryable=False)
            await self._reports.report(job, "failed", error)
            return None
        left_s = ttl_left_ms(task.ttl_ms, job.dispatched_ms) / 1000
        keep_alive_s = self.agent.ack_wait / 2
        entry = await self._room.enter(
            task, job.delivery, keep_alive_s=keep_alive_s, within_s=left_s
        )
        match entry:
            case "stopping":
                log.info("stopping: a task that had not started goes back to the queue")
                return 0.0
            case "expired":  # its ttl ran out while it waited for its handler's place
                await self._expire(job)
                return None
        # Looked at once in: another delivery may have run it meanwhile.
        if (kept := self._claims.unrecorded(task.message_id)) is not None:
            self._room.leave(task)
            log.info("answering a redelivery from an outcome not yet recorded")
            await self._conclude(job, kept)
            return None
        # Past its ttl (in the queue, or for room), unless it runs here: a redelivery after
        # an outage, which waits for that run's outcome (it said "no run of it finished").
        if ttl_left_ms(task.ttl_ms, job.dispatched_ms) <= 0 and not self._claims.runs_here(
            task.message_id
        ):
            self._room.leave(task)
            await self._expire(job)
            return None
        # Accepted while claiming and running: the ack and the event are on the wire before
        # the handler starts (so the event precedes this agent's next one in the stream), but
        # their round trip is not waited for. A duplicate that turns out to be done already
        # acknowledges, then answers with the stored result.
        accepting = asyncio.create_task(
            self._reports.accept(job, self._capacity_for(job.task), self._claims.epoch)
        )
        try:
            with self._claims.in_hand(task.message_id) as hand:  # until its outcome is recorded
                try:
                    ran = await self._claim_and_run(job, spec, hand)
                finally:
                    self._room.leave(task)
                if isinstance(ran, Outcome):
                    # Kept at once, before anything else is awaited: a redelivery that comes
                    # meanwhile (the accepted event stuck in an election) answers from it.
                    await self._conclude(job, ran)
                    return None
                return ran
        finally:
            await _published(accepting, "accepted")

    async def _expire(self, job: Job) -> None:
        """Report the task expired, unless it ran here: a run of it in this process answers
        (one still going is waited for: a redelivery after keep-alives lost to an outage; one
        whose outcome is not recorded yet), as does its stored result (a redelivery of a run
        whose ack was lost in a failover comes back past its ttl)."""
        message_id = job.task.message_id
        while self._claims.runs_here(message_id):
            with contextlib.suppress(BrokerError):
                await job.delivery.in_progress()
            await asyncio.sleep(BUSY_POLL_S)
        if (kept := self._claims.unrecorded(message_id)) is not None:
            log.info("answering a redelivery from an outcome not yet recorded")
            await self._conclude(job, kept)
            return
        if (done := await self._claims.done(job.task)) is not None:
            await self._reports.complete(job, done.result, 0, ref=done.result_ref)
            return
        task = job.task
        message = ttl_passed_in_queue(
            task.ttl_ms,
            self._me,
            dispatched_ms=job.dispatched_ms,
            received_ms=task.received_ms,
            delivered=job.delivery.num_delivered,
        )
        error = ErrorInfo(type="expired", message=message, retryable=False)
        await self._reports.report(job, "expired", error)

    async def _claim_and_run(
        self, job: Job, spec: HandlerSpec, hand: Hand
    ) -> Outcome | _Elsewhere | None:
        """The handler's outcome, to record and report; None when the message was done
        already (its stored result is sent again), ELSEWHERE when another delivery runs it."""
        task = job.task
        window_ms = min(spec.deadline_ms or task.budget.execute_ms, task.budget.execute_ms)
        claim = await self._claims.claim_when_free(
            task,
            window_ms + LEASE_GRACE_MS,
            still_working=job.delivery.in_progress,
            first=task.attempt == 1 and job.delivery.num_delivered == 1,
            seal=job.seal,
            hand=hand,
        )
        if isinstance(claim, Outcome):  # the delivery it waited for ran it, unrecorded yet
            log.info("answering from an outcome not yet recorded")
            return claim
        if isinstance(claim, AlreadyDone):
            log.info("already executed; sending the stored result again")
            record = claim.record
            await self._reports.complete(job, record.result, duration_ms=0, ref=record.result_ref)
            return None
        if isinstance(claim, AlreadyFailed):
            log.info("already ran and failed; reporting the failure again, not running it")
            said = ErrorInfo(type="Error", message="failed (its record says no more)")
            await self._reports.report(job, "failed", claim.record.error or said)
            return None
        if isinstance(claim, Moved):
            log.info("not run: liveness moved this attempt away while it waited here")
            await self._reports.report(job, "failed", claim.error)
            return None
        if isinstance(claim, Expired):
            # Past its ttl by the coordinator's clock though not by ours: ours runs behind.
            log.warning(
                "not run: the task was ended as expired already (is this host's clock behind?)",
                ttl_ms=task.ttl_ms,
                by=claim.record.error.message if claim.record.error else None,
            )
            await self._expire(job)
            return None
        if not await self._lease_holds(task, claim, window_ms + LEASE_GRACE_MS):
            log.warning("claim taken over while this delivery was claimed; the other one runs")
            return ELSEWHERE
        return await self._run(job, spec, claim)

    async def _lease_holds(self, task: Task, claim: Claimed, lease_ms: int) -> bool:
        """Claiming can wait out a leader election; if the lease ran down meanwhile, a
        redelivery may have taken the message over (and runs it). Renew a lease that lost
        more than half its grace; False when it was taken."""
        if claim.lease_until_ms - now_ms() > lease_ms - LEASE_GRACE_MS // 2:
            return True
        return await self._claims.renew(task, claim, lease_ms)

    async def _run(self, job: Job, spec: HandlerSpec, claim: Claimed) -> Outcome:
        task = job.task
        budget_ms = task.budget.execute_ms
        if claim.resumed:  # a crashed run of this attempt spent part of the budget already
            budget_ms -= max(0, now_ms() - claim.started_ms)
            if budget_ms <= 0:
                return failed(claim, spent(task, claim))
        deadline = Deadline(budget_ms=budget_ms, window_ms=spec.deadline_ms)

        async def report(note: str) -> None:
            await self._reports.progress(job, note)
            if not await self._claims.renew(task, claim, deadline.lease_ms()):
                log.warning("claim lost while running: this run's result will be refused")
                progressing.end()

        progressing = Progressing(report)

        async def progressed(note: str) -> None:
            if progressing.ended:  # the run is over: its deadline too
                return
            with deadline.held():  # the window starts again (at each end of the hold)
                await progressing.say(note)

        ctx = TaskContext(
            task,
            agent_id=self._me,
            deadline=deadline,
            report_progress=progressed,
            submit=self._submit,
            invoke=self._invoke,
            loop=asyncio.get_running_loop(),
            resumed=claim.resumed,
        )
        # A thread past its deadline runs on: its claim is kept live until it ends, renewed
        # every half ack wait (a crashed process's lease then lapses as its message returns).
        every_s = self.agent.ack_wait / 2
        lease_ms = int(self.agent.ack_wait * 1000) + LEASE_GRACE_MS

        def overrun() -> contextlib.AbstractAsyncContextManager[None]:
            return self._claims.kept(task, claim, lease_ms=lease_ms, every_s=every_s)

        started = time.monotonic()
        try:  # still being worked on: a handler past the ack wait is not delivered again
            async with job.delivery.kept_alive(self.agent.ack_wait / 2):
                payload = await self.claim_check.payload_of(task)  # a claim-checked one is fetched
                payload = typed(payload, spec.payload_type)
                try:
                    result = await call(spec, ctx, payload, deadline, overrun=overrun)
                except Exception as exc:
                    if (refused := failed_on_null(exc, payload, spec.payload_type)) is exc:
                        raise
                    raise refused from exc
                result = sendable(result)
                # Stowed before it is recorded: the record and the reply stay small.
                result, ref = await self.claim_check.stow_result(task, result)
        except PayloadUnavailable as exc:
            error = ErrorInfo(type="payload_unavailable", message=str(exc), retryable=False)
            outcome = failed(claim, error)
        except TooLarge as exc:  # a result too large to send: running it again cannot help
            error = ErrorInfo(type="result_too_large", message=str(exc), retryable=False)
            outcome = failed(claim, error)
        except Exception as exc:  # every handler failure is reported, none is lost
            error = error_info(exc, deadline.total_ms)
            if isinstance(exc, DeadlinePassed | InvalidPayload | PermanentError):
                outcome = failed(claim, error)
            else:  # where it raised, for its author: one line with the traceback
                log.warning("handler raised", error_type=error.type, exc_info=exc)
                outcome = Outcome(claim, error=error)
        else:
            duration_ms = int((time.monotonic() - started) * 1000)
            self.latency.observe(task.topic, duration_ms)
            past = deadline.total_ms if deadline.overrun else None
            outcome = Outcome(claim, result, None, duration_ms, ref, past)
        finally:
            self._reports.forget(task.message_id)
            await progressing.close()
        return outcome

    async def _conclude(self, job: Job, outcome: Outcome) -> None:
        """Record the outcome (it survives a broker outage meanwhile), then report it."""
        delivery, task = job.delivery, job.task
        try:
            recorded = await self._claims.record(task, outcome, still_working=delivery.in_progress)
        except (ValueTooLarge, TooLarge) as exc:
            outcome = failed(outcome.claim, unrecordable(outcome, exc).error)
            recorded = await self._claims.record(task, outcome, still_working=delivery.in_progress)
        if outcome.error is not None:
            await self._reports.report(job, "failed", outcome.error)
            return
        if not recorded:
            # Fenced: the task was reassigned or ended as expired while this ran.
            log.warning("late result rejected: the task was reassigned or ended meanwhile")
            await self._reports.say(job, "late_result_rejected")
            return
        await self._reports.complete_run(job, outcome)

    async def _submit(self, task: Task) -> None:
        """A sub-task this agent sends, as itself."""
        subject = self.broker.names.task(task.topic, self._me)
        await self.broker.publish(subject, envelopes.encode(task), headers=task_headers(task))

    async def _invoke(self, task: Task, ack_deadline_ms: int, result_type: Any) -> Any:
        """A sub-task this agent sends, as itself, waiting for its result (ctx.invoke)."""
        budget = msgspec.structs.replace(task.budget, ack_ms=max(1, ack_deadline_ms))
        task = msgspec.structs.replace(task, budget=budget)
        return await self._client.invoke_task(task, result_type=result_type)

    def _capacity_for(self, task: Task) -> Capacity:
        """How full this agent is for ``task``'s topic, told to its sender with the ack."""
        return Capacity(
            free_slots=self._room.free_for(task), est_latency_ms=self.latency.of(task.topic)
        )


async def _published(publishing: asyncio.Task[None], what: str) -> None:
    """Wait for a report that went out beside the work; one the broker lost is said, not
    raised: the work it reports on goes on, and its outcome is what counts."""
    try:
        await publishing
    except BrokerError as exc:
        log.warning("report not published", report=what, error=str(exc))
