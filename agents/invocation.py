"""Waiting for an invoked task's end: its replies as they come, and its recorded events
when the replies may have been lost."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.agents.coordinator_presence import (
    COORDINATOR_SILENT,
    NO_COORDINATOR,
    coordinator_runs,
)
from agentreach.agents.errors import (
    REJECTION_REASONS,
    DeadlineExceeded,
    InvalidArgument,
    InvokeError,
    NotAcknowledged,
    Rejected,
    TaskFailed,
    UnexpectedResult,
)
from agentreach.agents.handlers import type_name
from agentreach.broker import Broker, BrokerError, BrokerTimeout, NoResponders
from agentreach.broker.endings import Ended, OthersMessage, Sent, ending_of, wait_for_ending
from agentreach.envelopes import (
    Ack,
    ErrorInfo,
    ErrorReply,
    Event,
    PayloadRef,
    Progress,
    Result,
    Task,
    now_ms,
)
from agentreach.envelopes.audit import summary_of_task
from agentreach.logs import get_logger

log = get_logger("agents")

RECHECK_S = 1.0  # how often a wait looks for a reconnect, and then reads the events
MIN_READ_S = 1.0  # the least time a read of the events is given, at a deadline too
VERDICT_GRACE_S = 1.0  # past the execute deadline, for the coordinator's verdict to arrive
OnAck = Callable[[Ack], Awaitable[None] | None]
OnProgress = Callable[[Progress], Awaitable[None] | None]


class Ending:
    """How a message ended, read from its events, for when its replies may have been lost:
    replies are core NATS messages, and one sent while the connection was down (a server
    restart) is gone. Read at a deadline, and once a second after a reconnect or a lost ack."""

    def __init__(self, broker: Broker, read: Callable[[], Awaitable[list[Event]]]) -> None:
        self._broker, self._read = broker, read
        self._reconnects = broker.reconnects
        self.lost = False  # a reply is known lost (the events say what it would have said)
        self.graced = False  # the wait went past the execute deadline for a verdict
        self.events: list[Event] = []  # as last read
        self.unread = ""  # why the last read of the events failed ("": it did not)

    def polled(self) -> bool:
        """Whether to read the events every second: since a reconnect, or a reply known lost."""
        return self.lost or self._broker.reconnects != self._reconnects

    async def read(self, within_s: float | None = None) -> tuple[Ended | None, bool]:
        """How it ended (None: not yet, or not read: ``unread`` says why), and whether an
        agent accepted it. A read past ``within_s`` is not read: with the server away each
        read waited 5 s, and a wait ended 6 s past its deadline (a trial)."""
        try:
            async with asyncio.timeout(within_s):
                events = self.events = await self._read()
        except (BrokerError, OthersMessage, TimeoutError) as exc:
            self.unread = str(exc) or f"no answer within {within_s:g} s"
            return None, False
        self.unread = ""
        return ending_of(events), any(e.event == "accepted" for e in events)

    def why_unacknowledged(self, *, coordinator_answered: bool = True) -> str:
        """Where the events last read leave a task no agent acknowledged, in words;
        ``coordinator_answered``: whether a coordinator answered just now."""
        routed = [e for e in self.events if e.event == "routed"]
        if not routed and not coordinator_answered:
            # A stopped (SIGSTOP) or overloaded coordinator: the agents were blamed (a trial).
            return (
                f"not routed yet: {COORDINATOR_SILENT}, or no agent serving it may take work"
                " now (`reach agents` says which)"
            )
        if not routed:
            return (
                "not routed yet: no agent serving it may take work now (`reach agents` says"
                " which), or tasks stored before it wait first"
            )
        last = routed[-1]
        # An outage said "busy or stopped" of an agent that was only cut off (a trial).
        broke = self._broker.reconnects != self._reconnects
        outage = " (this client's own connection broke meanwhile)" if broke else ""
        return (
            f"it waits in the queue of {last.agent_id!r} (attempt {last.attempt}), which has"
            " not taken it: all its places are busy, it stopped taking work, or it is cut off"
            f" from NATS{outage}"
        )


async def wait_for_result(
    task: Task,
    replies: asyncio.Queue[envelopes.Reply | None],
    on_ack: OnAck | None,
    on_progress: OnProgress | None,
    ending: Ending,
) -> Any:
    """The task's result (and its reference), or its failure raised. Once accepted, it is
    waited for ``task.budget.execute_ms`` from the latest ack (a retry's), and at least until
    its ttl has run out: a workflow is acknowledged at once and lives for its ttl."""
    ids = {"message_id": task.message_id, "trace_id": task.trace_id}
    loop = asyncio.get_running_loop()
    ack_by = loop.time() + task.budget.ack_ms / 1000
    lives_until = loop.time() + task.ttl_ms / 1000

    def executed_by() -> float:
        return max(loop.time() + task.budget.execute_ms / 1000, lives_until)

    done_by: float | None = None
    while True:
        deadline = done_by if done_by is not None else ack_by
        # Woken every second, not only at the deadline: a reconnect during a wait (which may
        # last the whole ttl) must start the reads of the events within a second of it.
        look_at = min(deadline, loop.time() + RECHECK_S)
        try:
            # A deadline on the wait itself: wait_for would make a task of every get.
            async with asyncio.timeout_at(look_at):
                message = await replies.get()
        except TimeoutError:
            if loop.time() < deadline and not ending.polled():
                continue  # no reconnect, no reply known lost: the replies still tell it all
            ended, accepted = await ending.read(max(MIN_READ_S, deadline - loop.time()))
            if ended is not None:
                return outcome_of(ended, ids, ran=accepted or done_by is not None)
            if accepted and done_by is None:  # its ack was lost: the execute budget runs
                done_by = executed_by()
                ending.lost = True
                continue
            if loop.time() < deadline:
                continue
            if done_by is not None and not ending.graced:
                # The coordinator's verdict at the same deadline (expired) is a moment behind.
                ending.graced, done_by = True, deadline + VERDICT_GRACE_S
                continue
            if done_by is None:
                raise NotAcknowledged(
                    f"no agent acknowledged {task.topic!r} within {task.budget.ack_ms} ms", **ids
                ) from None
            late = f"{task.topic!r} did not complete within {task.budget.execute_ms} ms"
            unread = f" (its events could not be read: {ending.unread})" if ending.unread else ""
            raise DeadlineExceeded(
                f"{late} nor its ttl of {task.ttl_ms} ms{unread}; it may still complete:"
                f" invoke again with message_id={task.message_id!r} to hear how it ends",
                **ids,
            ) from None
        match message:
            case None:
                raise InvokeError(f"the client was closed while {task.topic!r} ran", **ids)
            case Ack():
                # Each attempt's budget runs from its own ack: a retry accepted just before
                # the ttl ends runs past it, and the coordinator's verdict comes after.
                if done_by is None or executed_by() > done_by:
                    done_by, ending.graced = executed_by(), False
                await _call(on_ack, message)
            case Progress():
                await _call(on_progress, message)
            case Result():
                return message.result, message.result_ref
            case ErrorReply(error=error, attempt=attempt, reason=reason, ran=said, attempts=run):
                # A workflow says whether it dispatched a step: its own ack (the instance
                # was created) tells nothing of that, and no agent accepts the workflow.
                ran = said if said is not None else done_by is not None  # a handler took it
                if said is None and not ran and _after_an_attempt(error, attempt):
                    ran = (await ending.read())[1]  # its ack may have been lost
                raise failure(error, ids, ran=ran, ending=reason, attempt=attempt, attempts=run)


def outcome_of(ended: Ended, ids: dict[str, str], *, ran: bool) -> tuple[Any, PayloadRef | None]:
    """The result ``ended`` holds, or its error raised; ``ran``: an agent accepted it (what
    the ending itself says of that, a workflow's, comes first)."""
    if ended.error is not None:
        ran = ended.ran if ended.ran is not None else ran
        raise failure(
            ended.error,
            ids,
            ran=ran,
            ending=ended.reason,
            attempt=ended.attempt,
            attempts=ended.attempts,
        )
    return ended.result, ended.result_ref


def failure(
    error: ErrorInfo,
    ids: dict[str, str],
    *,
    ran: bool,
    ending: str | None = None,
    attempt: int | None = None,
    attempts: int | None = None,
) -> TaskFailed:
    """Rejected for a refusal before any agent accepted the task (nothing ran, so sending it
    again is safe); TaskFailed for a handler's failure, and for a refusal that came after
    an attempt ran (a retry refused by its breaker, a ttl out between retries)."""
    refused = error.type in REJECTION_REASONS and not ran
    kind = Rejected if refused else TaskFailed
    return kind(error, **ids, ending=ending, attempt=attempt, attempts=attempts)


def _after_an_attempt(error: ErrorInfo, attempt: int) -> bool:
    """Whether a refusal may follow an attempt that ran: a retry's (attempt 2 on), or an
    expiry, which also ends a task whose failed attempt leaves no time for the next."""
    return error.type in REJECTION_REASONS and (attempt > 1 or error.type == "expired")


async def _call(callback: Callable[[Any], Any] | None, message: msgspec.Struct) -> None:
    """The caller's ``on_ack`` / ``on_progress``; what it raises is logged, not raised: it
    aborted the invoke, whose task ran on and completed, its result then nowhere (and a
    resend under a new id runs the work twice)."""
    if callback is None:
        return
    try:
        outcome = callback(message)
        if asyncio.iscoroutine(outcome):
            await outcome
    except Exception:
        kind = type(message).__name__.lower()
        message_id = getattr(message, "message_id", None)
        log.exception(f"the invoke's {kind} callback raised; it goes on", message_id=message_id)


def as_type(result: Any, result_type: Any, task: Task) -> Any:
    """``result`` converted to ``result_type`` (None: as it came); UnexpectedResult, saying
    where it does not fit, when it cannot be."""
    if result_type is None:
        return result
    try:
        return msgspec.convert(result, result_type)
    except (msgspec.ValidationError, TypeError) as exc:
        shown = type_name(result_type)
        raise UnexpectedResult(
            f"{task.topic!r} completed, but its result does not fit result_type {shown}: {exc}",
            message_id=task.message_id,
            trace_id=task.trace_id,
            result=result,
        ) from exc


async def unacknowledged(
    exc: NotAcknowledged, task: Task, ending: Ending, broker: Broker
) -> NotAcknowledged:
    """``exc``, saying where the task waits, or that no coordinator runs: then nothing routes
    it, and waiting longer for an agent cannot help. Asked only now, on the failure path."""
    ids, hint = {"message_id": exc.message_id, "trace_id": exc.trace_id}, still_queued
    if (runs := await coordinator_runs(broker)) is not False:
        why = ending.why_unacknowledged(coordinator_answered=runs is True)
        return NotAcknowledged(f"{exc}: {why}; {hint(exc.message_id, task)}", **ids)
    # Said both: the task waits in the intake, and runs once a coordinator starts.
    return NotAcknowledged(f"{exc}: {NO_COORDINATOR}; {hint(exc.message_id, task)}", **ids)


def still_queued(message_id: str, task: Task | None = None) -> str:
    """What a NotAcknowledged caller may do (no agent took the task yet; it is queued,
    unless its ``task``'s ttl has passed: then no agent will start it)."""
    if task is not None and now_ms() >= task.created_at + task.ttl_ms:
        return (
            f"its ttl ({task.ttl_ms} ms) has passed, so no agent will start it: invoke again"
            f" with message_id={message_id!r} to hear how it ended"
        )
    return (
        "it stays queued and may still run within its ttl: invoke again with"
        f" message_id={message_id!r} to hear how it ends"
    )


async def earlier_result(
    task: Task, read: Callable[[], Awaitable[list[Event]]], caller: str, broker: Broker
) -> tuple[Any, PayloadRef | None]:
    """The outcome of the message already taken in under ``task``'s id, once it ends, read
    from its events for as long as the task could take (see :func:`ended_result`)."""
    within_s = (task.budget.ack_ms + task.budget.execute_ms) / 1000
    ids = {"message_id": task.message_id, "trace_id": task.trace_id}
    sent = Sent(task.topic, summary_of_task(task).sha256)
    return await ended_result(ids, read, caller, broker, within_s=within_s, sent=sent)


async def ended_result(
    ids: dict[str, str],
    read: Callable[[], Awaitable[list[Event]]],
    caller: str,
    broker: Broker,
    *,
    within_s: float,
    sent: Sent | None = None,
) -> tuple[Any, PayloadRef | None]:
    """The outcome of ``caller``'s message ``ids["message_id"]``, read from its events
    (``read``) until it ends, for up to ``within_s``; its failure raised as ``invoke``
    raises it. ``sent``: what was just sent again under its id (None: the message is only
    looked up). On a secured server the events come from the coordinator: while none
    runs the message is not known to have ended, and the caller is told so
    (``NotAcknowledged``) — not handed the broker's "nobody answers", which reads as "not
    sent" and invites a resend under a new id."""
    message_id = ids["message_id"]
    seen: list[Event] = []
    unanswered = False

    async def events() -> list[Event]:
        nonlocal unanswered
        try:
            seen[:], unanswered = await read(), False
        except (NoResponders, BrokerTimeout):
            unanswered = True
        return seen

    try:
        ended = await wait_for_ending(events, within_s=within_s, caller=caller, sent=sent)
    except OthersMessage as exc:
        if sent is None:
            message = f"message_id={message_id!r}: {exc}"
            raise InvalidArgument(message, argument="message_id") from None
        taken = f"{exc}: send it under an id of your own"
        error = ErrorInfo(type="duplicate_id", message=taken, retryable=False)
        raise Rejected(error, **ids, ending="duplicate_id") from None
    if ended is not None:
        return outcome_of(ended, ids, ran=any(e.event == "accepted" for e in seen))
    sent_again = sent is not None
    what = f"message {message_id!r}" + (" (sent before)" if sent_again else "")
    # Not ended: when no coordinator runs, that is why (on an open server too).
    if unanswered or await coordinator_runs(broker) is False:
        raise NotAcknowledged(f"{what}: {NO_COORDINATOR}; {still_queued(message_id)}", **ids)
    if not seen and not sent_again:
        raise DeadlineExceeded(
            f"{what}: no event of it is recorded (not sent by {caller!r}, or before what"
            " REACH_EVENTS keeps)",
            **ids,
        )
    raise DeadlineExceeded(f"{what} did not end within {within_s * 1000:.0f} ms", **ids)
