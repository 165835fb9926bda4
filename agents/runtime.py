"""A running agent: its registration, one consumer and worker pool per priority,
and the execution of each task from receipt to result."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import msgspec
import nats.errors
import nats.js.errors
import structlog
from agentreach.agents.context import TaskContext
from agentreach.agents.errors import PermanentError
from agentreach.agents.executions import AlreadyDone, Busy, Claimed, ExecutionRecords
from agentreach.agents.liveness import Heartbeats, Load, Presence, Watchdog
from agentreach.agents.registration import await_slot, write_card
from agentreach.broker import Broker, BrokerError
from agentreach.broker.consume import ConsumerSpec, bind, fetch
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import about, dead_letter, emit, event_for, now_ms, reply
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import (
    PRIORITIES,
    Ack,
    AgentCard,
    Capacity,
    DecodeError,
    ErrorInfo,
    Priority,
    Progress,
    Result,
    Task,
)
from agentreach.envelopes.headers import task_headers
from nats.aio.msg import Msg

from agentreach import envelopes

if TYPE_CHECKING:
    from agentreach.agents.agent import Agent, HandlerSpec

log = structlog.get_logger("agents")

FETCH_WAIT_S = 0.5
PRESENCE_CHECK_S = 0.5
DRAIN_TIMEOUT_S = 10.0
BUSY_POLL_S = 0.5
LEASE_GRACE_MS = 1_000  # time to record the outcome after the deadline


class AgentRuntime:
    """One process serving an :class:`Agent`; made by ``Agent.running()``."""

    def __init__(self, agent: Agent, broker: Broker) -> None:
        self.agent = agent
        self.broker = broker
        self.card: AgentCard | None = None
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._pools = {p: WorkerPool(agent.capacity) for p in PRIORITIES}
        self._latency = LatencyEstimate()
        self._executions: ExecutionRecords
        self._presence: Presence | None = None
        self._duties: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        if self._loops or self._closed.is_set():
            raise RuntimeError("an AgentRuntime runs once; call Agent.running() again")
        agent = self.agent
        if agent.startup_delay:
            # Spread the registrations of a fleet that starts at once (seed 000).
            await asyncio.sleep(random.uniform(0, agent.startup_delay))
        self._presence = Presence(
            self.broker, agent.agent_id, version=_version(agent), tags=agent.tags
        )
        await self._presence.check_free(timeout_s=PRESENCE_CHECK_S)
        await self._presence.start()
        interval = await await_slot(self.broker, agent.agent_id) or agent.heartbeat_interval
        self.card = await write_card(self.broker, agent.card(status="running"))
        self._executions = ExecutionRecords(
            await self.broker.kv(self.broker.names.executions_bucket),
            agent.agent_id,
            self.card.epoch,
        )
        subs = {p: await bind(self.broker.js, self._consumer(p)) for p in PRIORITIES}
        self.heartbeats = Heartbeats(
            self.broker,
            agent.agent_id,
            self.card.epoch,
            interval_s=interval,
            load=self._load,
            clock=agent.clock,
        )
        self.watchdog = Watchdog(agent.watchdog_threshold)
        self._duties = [
            asyncio.create_task(self.heartbeats.run(), name=f"{agent.agent_id}-heartbeats"),
            asyncio.create_task(self.watchdog.run(), name=f"{agent.agent_id}-watchdog"),
        ]
        self._loops = [
            asyncio.create_task(self._consume(p, sub), name=f"{agent.agent_id}-{p}")
            for p, sub in subs.items()
        ]
        log.info(
            "agent serving",
            agent_id=agent.agent_id,
            epoch=self.card.epoch,
            topics=sorted(agent.handlers),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def stop(self) -> None:
        """Stop taking work, let running handlers finish, mark the card stopped."""
        if self._closed.is_set():
            return
        self._stopping.set()
        # Let each loop finish its current fetch: a pull request cut short would leave the
        # server delivering into a dead inbox, and that message would wait out the ack wait.
        await _finish(self._loops, FETCH_WAIT_S * 4)
        await _finish(list(self._in_flight), DRAIN_TIMEOUT_S)
        await _finish(self._duties, 0)
        with contextlib.suppress(BrokerError):
            await self._put_card(status="stopped")
        with contextlib.suppress(Exception):  # tells the coordinator at once: stopped, not lost
            kv = await self.broker.kv(self.broker.names.heartbeats_bucket)
            await kv.delete(self.agent.agent_id)
        if self._presence is not None:
            await self._presence.stop()
        self._closed.set()
        log.info("agent stopped", agent_id=self.agent.agent_id)

    # -- registration -------------------------------------------------------------
    def _consumer(self, priority: Priority) -> ConsumerSpec:
        names = self.broker.names
        return ConsumerSpec(
            stream=names.dispatch_stream(priority),
            durable=names.agent_consumer(self.agent.agent_id, priority),
            filter_subjects=(names.dispatch(self.agent.agent_id, priority),),
            ack_wait_s=self.agent.ack_wait,
            max_ack_pending=self.agent.capacity,
            max_deliver=self.agent.max_deliver,
        )

    async def _put_card(self, *, status: str) -> None:
        assert self.card is not None
        self.card = msgspec.structs.replace(self.card, status=status)
        kv = await self.broker.kv(self.broker.names.agents_bucket)
        try:
            await kv.put(self.agent.agent_id, envelopes.encode(self.card))
        except nats.errors.Error as exc:
            raise BrokerError(f"cannot write agent card: {exc}") from exc

    # -- consuming ----------------------------------------------------------------
    async def _consume(self, priority: Priority, sub: Any) -> None:
        pool = self._pools[priority]
        while not self._stopping.is_set():
            honour_cancellation()
            await pool.wait_free()
            try:
                messages = await fetch(sub, pool.free, wait_s=FETCH_WAIT_S)
            except BrokerError as exc:
                log.warning("fetch failed", priority=priority, error=str(exc))
                await asyncio.sleep(FETCH_WAIT_S)  # a broken connection: do not spin
                continue
            for msg in messages:
                pool.take()
                self._spawn(self._handle(msg, pool))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _handle(self, msg: Msg, pool: WorkerPool) -> None:
        try:
            await self._settle(msg)
        except Exception:  # a bug here must not lose the message: it comes back later
            log.exception("task handling crashed; the message will be redelivered")
            with contextlib.suppress(Exception):
                await msg.nak(delay=5.0)
        finally:
            pool.give()

    async def _settle(self, msg: Msg) -> None:
        try:
            task = envelopes.decode_task(msg.data)
        except DecodeError as exc:
            await self._undecodable(msg, exc)
            await msg.ack()
            return
        try:
            with structlog.contextvars.bound_contextvars(
                message_id=task.message_id, trace_id=task.trace_id, agent_id=self.agent.agent_id
            ):
                retry_in_s = await self._execute(msg, task)
        except BrokerError as exc:
            log.warning("could not report task outcome, will see it again", error=str(exc))
            retry_in_s = 1.0
        if retry_in_s is None:
            await msg.ack()
        else:
            with contextlib.suppress(Exception):
                await msg.nak(delay=retry_in_s)

    # -- executing ----------------------------------------------------------------
    async def _execute(self, msg: Msg, task: Task) -> float | None:
        """Run ``task`` at most once; returns when to see it again, or None when done."""
        dispatched_ms = int(msg.metadata.timestamp.timestamp() * 1000)
        spec = self.agent.handlers.get(task.topic)
        if spec is None:
            error = ErrorInfo(
                type="no_handler",
                message=f"{self.agent.agent_id} does not serve {task.topic!r}",
                retryable=False,
            )
            await self._report(task, "failed", error, dispatched_ms)
            return None
        if now_ms() - dispatched_ms >= task.ttl_ms:
            error = ErrorInfo(
                type="expired",
                message=f"ttl {task.ttl_ms} ms passed in the queue of {self.agent.agent_id}",
                retryable=False,
            )
            await self._report(task, "expired", error, dispatched_ms)
            return None
        deadline_ms = min(spec.deadline_ms or task.budget.execute_ms, task.budget.execute_ms)
        # Acknowledging while claiming saves a round trip; a duplicate that turns out
        # to be done already acknowledges, then answers with the stored result.
        claim, _ = await asyncio.gather(
            self._claim(msg, task, lease_ms=deadline_ms + LEASE_GRACE_MS), self._accept(task)
        )
        if isinstance(claim, AlreadyDone):
            log.info("already executed; sending the stored result again")
            await self._complete(task, claim.record.result, duration_ms=0)
            return None
        ctx = TaskContext(
            task,
            agent_id=self.agent.agent_id,
            deadline_ms=deadline_ms,
            report_progress=lambda note: self._progress(msg, task, note),
            submit=self._submit,
            loop=asyncio.get_running_loop(),
        )
        started = time.monotonic()
        try:
            result = await _call(spec, ctx, task.payload, deadline_ms)
        except Exception as exc:  # every handler failure is reported, none is lost
            error = _error_info(exc, deadline_ms)
            await self._executions.fail(task, claim, error)
            log.info("handler failed", error_type=error.type, error=error.message)
            await self._report(task, "failed", error, dispatched_ms)
            return None
        duration_ms = int((time.monotonic() - started) * 1000)
        self._latency.observe(duration_ms)
        if not await self._executions.finish(task, claim, result):
            # Fenced: the task was reassigned while this ran; the new attempt answers.
            log.warning("late result rejected: the task was reassigned")
            await emit(
                self.broker, event_for(task, "late_result_rejected", agent_id=self.agent.agent_id)
            )
            return None
        await self._complete(task, result, duration_ms)
        return None

    async def _claim(self, msg: Msg, task: Task, *, lease_ms: int) -> Claimed | AlreadyDone:
        """Claim the message, waiting here while another delivery holds it.

        The wait is not a redelivery: a duplicate that came back through nak would
        count towards max_deliver and could dead-letter a message that completes.
        """
        while True:
            claim = await self._executions.claim(task, lease_ms=lease_ms)
            if not isinstance(claim, Busy):
                return claim
            log.info("another delivery holds this message", retry_in_s=claim.retry_in_s)
            await msg.in_progress()
            await asyncio.sleep(min(claim.retry_in_s, BUSY_POLL_S))

    def _load(self) -> Load:
        pools = self._pools.values()
        return Load(
            in_flight=sum(p.busy for p in pools),
            free_slots=sum(p.free for p in pools),
            latency_ms=self._latency.estimate_ms,
        )

    async def _submit(self, task: Task) -> None:
        await self.broker.publish(
            self.broker.names.task(task.topic), envelopes.encode(task), headers=task_headers(task)
        )

    async def _accept(self, task: Task) -> None:
        capacity = Capacity(
            free_slots=self._pools[task.priority].free, est_latency_ms=self._latency.estimate_ms
        )
        ack = Ack(**_about(task, self.agent.agent_id), capacity=capacity)
        await asyncio.gather(
            reply(self.broker, task, ack),
            emit(self.broker, event_for(task, "accepted", agent_id=self.agent.agent_id)),
        )

    async def _progress(self, msg: Msg, task: Task, note: str) -> None:
        await asyncio.gather(
            msg.in_progress(),
            reply(self.broker, task, Progress(**_about(task, self.agent.agent_id), note=note)),
            emit(self.broker, event_for(task, "progress", agent_id=self.agent.agent_id, note=note)),
        )

    async def _complete(self, task: Task, result: Any, duration_ms: int) -> None:
        """Answer the sender, then tell the coordinator (the result is already recorded)."""
        await reply(self.broker, task, Result(**_about(task, self.agent.agent_id), result=result))
        completed = event_for(
            task, "completed", agent_id=self.agent.agent_id, result=result, duration_ms=duration_ms
        )
        await emit(self.broker, completed)

    async def _report(self, task: Task, event: str, error: ErrorInfo, dispatched_ms: int) -> None:
        """Tell the coordinator, which decides between retry and dead letter."""
        detail = {"task": task, "error": error, "dispatched_at_ms": dispatched_ms}
        await emit(self.broker, event_for(task, event, agent_id=self.agent.agent_id, **detail))

    async def _undecodable(self, msg: Msg, exc: DecodeError) -> None:
        headers = dict(msg.headers or {})
        message_id = envelopes.stable_id(
            int(msg.metadata.timestamp.timestamp() * 1e9),
            msg.metadata.stream,
            msg.metadata.sequence.stream,
        )
        log.warning("undecodable dispatch", subject=msg.subject, error=str(exc))
        await dead_letter(
            self.broker,
            reason="invalid_envelope",
            message_id=message_id,
            trace_id=message_id,
            topic="_invalid",
            raw=msg.data,
            headers=headers,
            error=ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False),
        )


async def _call(spec: HandlerSpec, ctx: TaskContext, payload: Any, deadline_ms: int) -> Any:
    timeout = deadline_ms / 1000
    if spec.is_async:
        async with asyncio.timeout(timeout):
            return await spec.func(ctx, payload)
    # A thread cannot be cancelled: past the deadline its late result is discarded.
    return await asyncio.wait_for(asyncio.to_thread(spec.func, ctx, payload), timeout)


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


def _about(task: Task, agent_id: str) -> dict[str, Any]:
    """An agent's answer: from this agent, to the task's sender."""
    return about(task, from_agent=agent_id, to_agent=task.from_agent)


def _version(agent: Agent) -> str:
    versions = sorted({spec.intent.version for spec in agent.handlers.values()})
    return versions[0] if len(versions) == 1 and versions[0].count(".") == 2 else "0.0.0"


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


class WorkerPool:
    """How many tasks of one priority run at once, and a way to wait for room."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.size - self.busy

    async def wait_free(self) -> None:
        while self.free <= 0:
            self._freed.clear()
            await self._freed.wait()

    def take(self) -> None:
        self.busy += 1

    def give(self) -> None:
        self.busy -= 1
        self._freed.set()


async def _finish(tasks: list[asyncio.Task[None]], timeout: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    await cancel_and_wait(*pending)
