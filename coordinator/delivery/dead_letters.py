"""How a task ends badly: a dead letter with its reason, or a ``rejected`` event for what
its sender may cause at will; either way an error to its sender."""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from agentreach.broker import Broker, Delivery
from agentreach.broker.dead_letters import dead_letter, dead_letter_delivery, stored_end
from agentreach.broker.lifecycle import about, emit, event_for, reply
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.envelopes import INVALID_TOPIC, DecodeError, ErrorInfo, ErrorReply, Task
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator")

# A flood's refusals are hundreds a second, each a `rejected` event already: a few lines of
# each kind and topic every 10 s, saying how many went unsaid.
_REFUSALS_SAID = RepeatedLines(10.0, burst=5)


async def end_with_error(
    broker: Broker,
    task: Task,
    reason: str,
    error: ErrorInfo,
    *,
    state: Any = None,
    ran: bool | None = None,
    started: bool = True,
    attempts: int | None = None,
) -> None:
    """Dead-letter ``task`` as ``reason`` (with ``state``, if any) and send ``error`` to its
    ``reply_to``; ``ran``, when known, says whether its work began (a workflow's step).
    ``started``: False when its present attempt never began (ended before its dispatch, or
    unclaimed in its agent's queue): it is not one of the attempts the letter says ran
    (``attempts``: how many ran, when known otherwise)."""
    if attempts is None:
        attempts = task.attempts_run - (0 if started else 1)
    await dead_letter(
        broker,
        reason=reason,
        task=task,
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
        error=error,
        state=state,
        ran=ran,
        attempts=attempts,
    )
    # Named here: a workflow's ending comes from no intake or outcome that bound its id.
    ids = {"message_id": task.message_id, "topic": task.topic}
    log.info("dead-lettered", reason=reason, error=error.message, **ids)  # once it is so
    reply_ = error_reply(task, error, reason, ran=ran, attempts=attempts)
    await reply(broker, task, reply_)


async def end_as_stored(broker: Broker, task: Task) -> bool:
    """End ``task`` as the ``dead_lettered`` event of its present attempt, stored already,
    says (its letter was refused, a full ``REACH_DLQ``); False when none is stored."""
    if (end := await stored_end(broker, task)) is None:
        return False
    error = end.error or ErrorInfo(type=end.reason, message=end.reason, retryable=False)
    # Once a second per task while REACH_DLQ is full: "a stream is full" says it once a minute.
    log.debug("a task whose letter could not be stored comes back: its letter again")
    await end_with_error(broker, task, end.reason, error, ran=end.ran, attempts=end.attempts)
    return True


async def refuse(
    broker: Broker, task: Task, error: ErrorInfo, *, letter: bool = False, **detail: Any
) -> None:
    """Refuse ``task``: a ``rejected`` event carrying ``error`` and ``detail``, and ``error``
    to its ``reply_to``. For refusals a sender can cause as often as it likes (over a rate),
    which must not fill the dead-letter stream: dead-lettered too only when ``letter`` (one
    nobody would hear of otherwise, at the rate's pace: see ``UnheardRefusals``)."""
    rejected = event_for(task, "rejected", error=msgspec.to_builtins(error), **detail)
    await emit(broker, rejected)
    if (unsaid := _REFUSALS_SAID.due(f"{error.type} {task.topic}")) is not None:
        log.info("refused", error=error.message, refused_unsaid_since_last=unsaid)
    if letter:
        await dead_letter(
            broker,
            reason="rejected",
            task=task,
            message_id=task.message_id,
            trace_id=task.trace_id,
            topic=task.topic,
            error=error,
            attempts=0,
        )
    await reply(broker, task, error_reply(task, error, "refused", attempts=0))


def error_reply(
    task: Task,
    error: ErrorInfo,
    reason: str,
    *,
    ran: bool | None = None,
    attempts: int | None = None,
) -> ErrorReply:
    """The ``error`` envelope answering ``task``, which ended as ``reason`` (``attempts``:
    those that ran, for an ending after attempts)."""
    return ErrorReply(**about(task, error=error, reason=reason, ran=ran, attempts=attempts))


async def unreadable_event(
    broker: Broker, msg: Delivery, exc: DecodeError, answers: ServerAnswers
) -> None:
    """An event (an outcome, an ending) that is not an event at all: its bytes go to the
    dead-letter stream, and the log says which subject sent it; one a minute of each sender
    (or of the server's answers someone aimed at the subject), saying how many came since.
    Every event but ``progress`` carries headers (protocol §12.1): one without is a server's
    answer."""
    sender = broker.names.sender_of(msg.subject)
    if (judged := answers.judged(exc, msg, "events", headed=True, by=sender)) is None:
        return
    exc = judged
    log.error("unreadable event", subject=msg.subject, error=str(exc))
    error = ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False)
    await dead_letter_delivery(
        broker, msg, reason="invalid_envelope", error=error, topic=INVALID_TOPIC
    )
