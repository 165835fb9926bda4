"""Act on what agents report: retry a failed task, or end it in the dead-letter stream.

The backoff between attempts lives here and only here: the ``failed`` event is
negatively acknowledged with the backoff as its delay, and its redelivery
dispatches the next attempt. So the wait survives a coordinator restart, and
JetStream's own redelivery never stacks another backoff underneath.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, Delivery
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.lifecycle import MessageEvents, emit, event_for, events_of, routed_callers
from agentreach.broker.names import COORDINATOR
from agentreach.coordinator.delivery.dead_letters import end_with_error, unreadable_event
from agentreach.coordinator.delivery.expiry import EXPIRED, fence_expiry
from agentreach.coordinator.delivery.retries import RetryConfig
from agentreach.coordinator.liveness.forward import send_on_cut_short
from agentreach.coordinator.protection.grants import (
    Grants,
    impersonation,
    routing_vouches,
    vouched_sender,
)
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.router import Router
from agentreach.coordinator.routing.run_once import (
    TAKEN_FROM_ITS_AGENT,
    WAIT_CAP_S,
    RanAlready,
    Running,
    RunOnce,
    answer_from_record,
    began,
    lease_limit,
    superseded,
    verdict_of,
)
from agentreach.envelopes import (
    INVALID_TOPIC,
    DecodeError,
    ErrorInfo,
    Event,
    Execution,
    ServerAnswer,
    Task,
    refuse_server_answers,
    stable_id,
    ttl_left_ms,
    unix_ms_of,
)

log = structlog.get_logger("coordinator.outcomes")

# What the coordinator acts on (failed, expired), and completed only to check who says it
# (when audit is off: the audit writer, which reads every completed event, checks it then).
OUTCOME_EVENTS = ("failed", "expired", "completed")
T = TypeVar("T")


# How often an outcome is looked at, a second apart, for the routed event that vouches for
# it on an open server: that event and the agent's report may be stored in either order
# through an election of REACH_EVENTS' leader, and an honest report dropped would leave its
# task without a retry or a dead letter.
OPEN_SERVER_LOOKS = 10


class Outcomes:
    """Turns ``failed`` and ``expired`` events into retries or dead letters."""

    def __init__(
        self,
        broker: Broker,
        router: Router,
        directory: AgentDirectory,
        config: RetryConfig,
        grants: Grants | None = None,
    ) -> None:
        self._broker = broker
        self._router = router
        self._directory = directory
        self._config = config
        self._grants = grants or Grants(None)
        self._run_once = RunOnce(broker, self._grants)
        self._server_answers = ServerAnswers()

    async def handle(self, msg: Delivery) -> float | None:
        """None to acknowledge the event, or seconds until it should come back."""
        try:
            event = envelopes.decode_stored_event(msg.data, msg.headers)
        except DecodeError as exc:
            await unreadable_event(self._broker, msg, exc, self._server_answers)
            return None
        if (sender := await vouched_sender(self._broker, msg.subject, event)) is None:
            return None
        if event.event == "completed":
            return None  # nothing to decide: the caller has its result, the trace its record
        if "raw" in event.detail and "task" not in event.detail:
            await self._undecodable(event, sender)
            return None
        try:
            task = _detail(event, "task", Task)
            error = _detail(event, "error", ErrorInfo)
        except DecodeError as exc:
            # No grant can be checked without the task: the routing is asked instead, so no
            # agent ends a task it was not given by sending a broken outcome about it.
            events = await events_of(self._broker, event.trace_id, event.message_id)
            vouched = await routing_vouches(self._broker, msg, event, events)
            if vouched is not True:
                return None if vouched is False else vouched
            return await self._incomplete(event, sender, exc, events)
        if not self._grants.holds(event.detail.get("grant"), task, sender):
            await impersonation(self._broker, sender, event, "no grant for this attempt")
            return None
        if not self._grants.enabled and sender != COORDINATOR:
            # No grant to check (an open server): the routing vouches instead, or an agent
            # ended (or retried, so that it ran twice) a task routed to another.
            events = await events_of(self._broker, event.trace_id, event.message_id)
            looks = OPEN_SERVER_LOOKS
            vouched = await routing_vouches(self._broker, msg, event, events, looks=looks)
            if vouched is not True:
                return None if vouched is False else vouched
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, agent_id=event.agent_id
        ):
            return await self._decide(event, task, error, msg)

    async def _decide(
        self, event: Event, task: Task, error: ErrorInfo, msg: Delivery
    ) -> float | None:
        delivered = msg.num_delivered
        records = await self._run_once.records(task)
        reported = (event.at_ms, msg.timestamp_ms, task.received_ms, event.event)
        if why := superseded(records, event.agent_id, task.attempt, *reported):
            if why == TAKEN_FROM_ITS_AGENT and await self._sent_on(event, task, records):
                return None  # the move that fenced it was cut short before it sent it on
            # A late report of an old run must not start a retry of its own.
            log.info("outcome that no longer counts; left alone", kind=event.event, why=why)
            return None
        # A failure or expiry reported of a message that ran (its acknowledgement lost in a
        # failover, a copy delivered after the ttl) is answered from its record; one that a
        # delivery runs now (a redelivery that took over a stalled run's lapsed lease) waits
        # for that run: it ends the message, or, should it die, the retry happens then.
        ttl_end_ms = _dispatched_at_ms(event) + task.ttl_ms
        match verdict_of(records, until_ms=lease_limit(task, ttl_end_ms)):
            case RanAlready(record=record):
                await answer_from_record(self._broker, task, record)
                return None
            case Running(left_s=left_s):
                # It comes back every WAIT_CAP_S while that run lasts: said once at info.
                say = log.info if delivered == 1 else log.debug
                say("reported while a delivery runs it; waiting", left_s=round(left_s, 3))
                return min(left_s + 0.05, WAIT_CAP_S)
        if event.event == "expired":
            ran = began(records, event.agent_id, task.attempt)
            await self._expired(event, task, error, began=ran)
            return None
        if not error.retryable:
            await end_with_error(self._broker, task, "rejected", error)
            return None
        allowed = self._config.allowed(task, self._directory.cards.get(event.agent_id or ""))
        if task.attempts_run >= allowed:
            await end_with_error(self._broker, task, "retries_exhausted", error)
            return None
        if delivered == 1:
            return await self._schedule(event, task, error)
        return await self._retry(event, task, waited=delivered - 2, origin=f"e{msg.stream_seq}")

    async def _sent_on(self, event: Event, task: Task, records: list[Execution]) -> bool:
        def allowed(task: Task, agent_id: str) -> int:
            return self._config.allowed(task, self._directory.cards.get(agent_id))

        return await send_on_cut_short(
            self._broker,
            task,
            event.agent_id or "",
            records,
            self._run_once,
            allowed=allowed,
            dispatched_ms=_dispatched_at_ms(event),
        )

    async def _expired(self, event: Event, task: Task, error: ErrorInfo, *, began: bool) -> None:
        """End the task its agent found expired, unless the coordinator's sweep of the queues
        ended it first (or a run of it holds the record now)."""
        if event.agent_id is not None:
            seal = self._grants.seal(task.caller, task.message_id, task.attempt, event.agent_id)
            fenced = await fence_expiry(
                self._broker,
                task,
                event.agent_id,
                error,
                seal=seal,
                ttl_end_ms=_dispatched_at_ms(event) + task.ttl_ms,
            )
            if fenced != "end":
                log.info("expiry reported of a task that is not to end now", why=fenced)
                # It ran (the records read before, from a replica behind, had not said so):
                # its result answers, and ends it when its agent could not say `completed`.
                if isinstance(ran := verdict_of(await self._run_once.records(task)), RanAlready):
                    await answer_from_record(self._broker, task, ran.record)
                return
        await end_with_error(self._broker, task, EXPIRED, error, started=began)

    async def _schedule(self, event: Event, task: Task, error: ErrorInfo) -> float | None:
        delay = self._config.backoff_s(task.attempts_run)  # moves unrun are not failures
        left_ms = ttl_left_ms(task.ttl_ms, _dispatched_at_ms(event))
        if left_ms <= delay * 1000:
            # No retry could be dispatched within the ttl: say so now, with what failed.
            # Not the dispatch's ttl_ms: that is what was left when it was routed, not what
            # its sender set (a caller read "ttl 1103 ms" of a task it sent with 3500).
            when = f"due in {int(delay * 1000)} ms, {max(0, left_ms)} ms of it left"
            await self._router.end(
                task,
                "expired",
                f"its ttl runs out before attempt {task.attempt + 1} ({when});"
                f" attempt {task.attempt} failed: {error.type}: {error.message}",
                started=True,  # the failed attempt ran: a trial's letter said attempts 1 of 2
            )
            return None
        log.info("retry scheduled", attempt=task.attempt + 1, delay_s=round(delay, 3))
        await emit(
            self._broker,
            event_for(
                task,
                "retry_scheduled",
                next_attempt=task.attempt + 1,
                delay_ms=int(delay * 1000),
                error=error,
            ),
        )
        return delay

    async def _retry(self, event: Event, task: Task, *, waited: int, origin: str) -> float | None:
        left_ms = ttl_left_ms(task.ttl_ms, _dispatched_at_ms(event))
        retry = msgspec.structs.replace(task, attempt=task.attempt + 1, to_agent=None)
        return await self._router.dispatch(
            retry, left_ms=left_ms, waited=waited, origin=origin, where="between retries"
        )

    async def _undecodable(self, event: Event, reporter: str) -> None:
        """An agent got a dispatch that was no task: its bytes go to the dead-letter stream,
        filed under an id of the report's own (:func:`_letter_id`)."""
        error = _detail(event, "error", ErrorInfo)
        raw = event.detail.get("raw")
        headers = _strings(event.detail.get("headers"))
        try:  # aimed at the agent's queue by anyone at all: one letter a minute says so
            queue = self._broker.names.dispatch(reporter, "P1").removesuffix(".p1") + ".<p>"
            refuse_server_answers(raw.encode() if isinstance(raw, str) else b"", headers, queue)
        except ServerAnswer as exc:
            if (said := self._server_answers.to_letter(exc, "dispatch")) is None:
                return
            error = ErrorInfo(type="invalid_envelope", message=str(said), retryable=False)
        letter_id = _letter_id(event.message_id, reporter)
        await dead_letter(
            self._broker,
            reason="invalid_envelope",
            message_id=letter_id,
            trace_id=letter_id,
            topic=INVALID_TOPIC,
            error=error,
            raw=raw.encode() if isinstance(raw, str) else None,
            truncated=event.detail.get("truncated") is True,
            headers={
                **headers,
                "Reach-Reported-By": reporter,
                "Reach-Reported-Id": event.message_id,
            },
        )

    async def _incomplete(
        self, event: Event, sender: str, exc: DecodeError, events: MessageEvents
    ) -> float | None:
        """An outcome without the task it is about cannot be retried: the task is ended with
        what the event says of it, naming what was missing (an agent not following the
        protocol). Unless its record says otherwise: a run that holds a live claim is waited
        for, and a message that ran is not ended; the fence in the agent's record refuses a
        result that comes after the end. The caller is one the attempt was routed to the agent
        for: the body's word only as far as the routing bears it out."""
        # A caller the event names was checked against the routing (routing_vouches).
        named = sender == COORDINATOR or event.caller is not None
        callers = {event.caller} if named else routed_callers(events, sender, event.attempt)
        if len(callers) != 1:  # routed to the agent for several callers: whose is not said
            log.warning("outcome event without its task, of no one caller: left alone",
                        message_id=event.message_id, callers=len(callers))  # fmt: skip
            return None
        stub = Task(
            v=1,
            message_id=event.message_id,
            trace_id=event.trace_id,
            topic=event.topic,
            attempt=event.attempt,
            caller=next(iter(callers)),
        )
        error = ErrorInfo(
            type="invalid_envelope",
            message=f"{event.event} event from {event.agent_id or 'an agent'}: {exc}",
            retryable=False,
        )
        verdict = verdict_of(await self._run_once.records(stub))
        if isinstance(verdict, Running):
            return min(verdict.left_s + 0.05, WAIT_CAP_S)
        fenced = "end"
        if verdict is None and event.agent_id is not None:
            seal = self._grants.seal(stub.caller, stub.message_id, stub.attempt, event.agent_id)
            fenced = await fence_expiry(self._broker, stub, event.agent_id, error, seal=seal)
        if fenced == "running":
            return WAIT_CAP_S
        if isinstance(verdict, RanAlready) or fenced == "ended":
            log.warning(
                "outcome event without its task, of a message that ran: left alone",
                message_id=event.message_id,
                error=str(exc),
            )
            return None
        log.error("outcome event without its task", message_id=event.message_id, error=str(exc))
        await end_with_error(self._broker, stub, "invalid_envelope", error)
        return None


def _dispatched_at_ms(event: Event) -> int:
    """When the attempt an outcome reports was dispatched: its ttl counts from then."""
    value = event.detail.get("dispatched_at_ms")
    return value if isinstance(value, int) and value > 0 else event.at_ms


def _strings(value: object) -> dict[str, str]:
    """A string-to-string mapping out of a detail (anything else in it left out)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _detail(event: Event, field: str, kind: type[T]) -> T:
    """``event.detail[field]`` as ``kind``; DecodeError naming ``$.detail.<field>`` if not."""
    try:
        return msgspec.convert(event.detail.get(field), kind)
    except msgspec.ValidationError as exc:
        if field not in event.detail:
            raise DecodeError(f"Object missing required field `{field}` - at `$.detail`") from None
        text, _, inner = str(exc).partition(" - at `$")
        raise DecodeError(f"{text} - at `$.detail.{field}{inner.rstrip('`')}`") from None


def _letter_id(reported_id: str, reporter: str) -> str:
    """The id an undecodable dispatch's dead letter is filed under: derived from the id the
    agent reported and the agent, so the same report made again is recorded once. It is
    never the id of another message: an agent naming one would otherwise put a dead letter
    into its trace, and take the deduplication id its real dead letter is written under."""
    return stable_id(unix_ms_of(reported_id) * 1_000_000, "undecodable", reporter, reported_id)
