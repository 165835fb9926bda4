"""Dead letters: what could not be handled, published to ``reach.dlq.<reason>.<topic>``
with its trace so far, after a ``dead_lettered`` event.

A letter is deduplicated by ``Nats-Msg-Id`` (one per life of a caller's message: the id
sent again past the intake's duplicate window is another life, with letters of its own), so
a process that crashes after publishing and does its work again does not record it twice.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.broker.connection import Broker
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.errors import BrokerError
from agentreach.broker.lifecycle import authentic, emit, event_message
from agentreach.broker.messages import Delivery
from agentreach.broker.names import COORDINATOR, OPERATOR
from agentreach.broker.runs import runs_of
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import DeadLetter, ErrorInfo, Event, Task, now_ms, stable_id
from agentreach.envelopes.audit import summary_of_task
from agentreach.envelopes.coordination import workflow_step_of
from agentreach.errors import ReachError
from agentreach.logs import get_logger

log = get_logger("broker.dead_letters")

HEADROOM = 4096  # for a dead letter's headers and framing under the server's max payload
TRACE_ENDS = 50  # events kept at each end of a trace too large for its letter even bare
RAW_KEPT = 65_536  # characters of an oversized raw body a dead letter keeps
SETTLING = ("replayed", "resolved")  # the events that close a letter, as its state


async def dead_letter(
    broker: Broker,
    *,
    reason: str,
    task: Task | None = None,
    message_id: str,
    trace_id: str,
    topic: str,
    error: ErrorInfo | None = None,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    state: Any = None,
    truncated: bool = False,
    caller: str | None = None,
    ran: bool | None = None,
    attempts: int | None = None,
) -> DeadLetter:
    """Publish a dead letter to ``reach.dlq.<reason>.<topic>`` with the trace so far,
    and record a ``dead_lettered`` event (``truncated``: ``raw`` was cut before it came;
    ``caller``: who sent what did not decode into ``task``; ``ran``: as its error reply says;
    ``attempts``: how many ran, when not every one of ``task``'s did, its own included).
    A workflow's step is named in the letter (``workflow``)."""
    caller = task.caller if task is not None else caller
    stored = await indexed_messages_on(
        broker, broker.names.events_stream, broker.names.events_of_message(message_id)
    )
    pairs = authentic(broker.names, stored)
    if caller is not None:  # its own run of that id, no other's
        trace, _ = runs_of(caller, pairs, broker.names)
    else:
        trace = [event for _, event in pairs]
    if task is not None and task.received_ms > 0:  # this life's: an earlier one was settled
        trace = [event for event in trace if event.received_ms in (0, task.received_ms)]
    if task is not None and (stored := _ended_already(broker, pairs, task)) is not None:
        reason, error, ran = stored.reason, stored.error, stored.ran
    letter = DeadLetter(
        v=1,
        reason=reason,
        message_id=message_id,
        trace_id=trace_id,
        topic=topic,
        attempts=(task.attempts_run if task else 0) if attempts is None else attempts,
        envelope=task,
        raw=printable(raw),
        headers=dict(headers or {}),
        error=error,
        trace=trace,
        at_ms=now_ms(),
        state=state,
        truncated=truncated,
        workflow=workflow_step_of(broker.names.workflow_of(task.reply_to), task) if task else None,
    )
    data = envelopes.encode(letter)
    if len(data) > broker.max_payload - HEADROOM:
        letter, data = _fitted(letter, broker.max_payload - HEADROOM)
    # The event is stored before the letter is published: a worker can act on the letter
    # (a ``resolved``, a ``replayed``) only once it exists, so its events come after this
    # one in the stream's order, which is the trace's. A crash between the two leaves the
    # event alone; the task's redelivery publishes the letter (the event is deduplicated).
    await emit(
        broker,
        Event(
            v=1,
            event="dead_lettered",
            message_id=message_id,
            trace_id=trace_id,
            topic=topic,
            attempt=task.attempt if task else 1,
            at_ms=letter.at_ms,
            caller=caller,  # its sender reads it in its own trace
            detail=_letter_detail(reason, letter, error, ran),
            priority=task.priority if task else "P1",
            received_ms=task.received_ms if task else 0,
        ),
    )
    await broker.publish(
        broker.names.dlq(reason, topic),
        data,
        headers={
            "Nats-Msg-Id": _letter_id(caller, message_id, task.received_ms if task else 0),
            "Reach-Trace-Id": trace_id,
        },
    )
    return letter


async def dead_letter_delivery(
    broker: Broker,
    delivery: Delivery,
    *,
    reason: str,
    error: ErrorInfo,
    topic: str,
    trace_id: str | None = None,
) -> DeadLetter:
    """Dead-letter a stored message that could not be handled as it is (see
    :func:`dead_letter_stored`)."""
    return await dead_letter_stored(
        broker, delivery.stream, delivery, reason=reason, error=error, topic=topic,
        trace_id=trace_id,
    )  # fmt: skip


async def dead_letter_stored(
    broker: Broker,
    stream: str,
    stored: Delivery | StoredMessage,
    *,
    reason: str,
    error: ErrorInfo,
    topic: str,
    trace_id: str | None = None,
) -> DeadLetter:
    """Dead-letter ``stored``, a message of ``stream`` that could not be handled as it is:
    its bytes, headers and subject go into the letter, under an id derived from its stream
    and sequence (the same on every redelivery, so it is recorded once)."""
    message_id = stable_id(stored.timestamp_ns, stream, stored.stream_seq)
    return await dead_letter(
        broker,
        reason=reason,
        message_id=message_id,
        trace_id=trace_id or message_id,
        topic=topic,
        error=error,
        raw=stored.data,
        headers={**stored.headers, "Reach-Subject": stored.subject},
    )


class StoredEnd(msgspec.Struct, frozen=True):
    """What a stored ``dead_lettered`` event of the coordinator said of an attempt."""

    reason: str
    error: ErrorInfo | None
    ran: bool | None
    attempts: int | None


async def stored_end(broker: Broker, task: Task) -> StoredEnd | None:
    """The end the coordinator stored for this very attempt of ``task``'s life, if any: its
    ``dead_lettered`` event is written before its letter, so a letter refused (a full
    ``REACH_DLQ``) leaves the event alone, and the message that comes back is ended as it
    says, not decided again (a `rejected` task was routed on its return, and completed)."""
    stored = await indexed_messages_on(
        broker, broker.names.events_stream, broker.names.events_of_message(task.message_id)
    )
    return _ended_already(broker, authentic(broker.names, stored), task)


def _ended_already(
    broker: Broker, pairs: list[tuple[StoredMessage, Event]], task: Task
) -> StoredEnd | None:
    """What the coordinator's ``dead_lettered`` event of this very attempt of ``task``'s
    life (its caller, ``received_ms`` and attempt), stored already, said: its letter was
    refused (a full ``REACH_DLQ``) and comes again on the message's redelivery, and it says
    that, not what would be decided now (`no_route` tasks that waited for room were lettered
    `expired`, their ttl passed meanwhile, under a trace that said `no_route`). Another
    message under the id (an undecodable one says no ``received_ms``) is not this one."""
    if not task.received_ms:
        return None
    this_attempt = (task.caller, task.received_ms, task.attempt)
    ended = next(
        (
            e
            for m, e in pairs
            if e.event == "dead_lettered"
            and broker.names.sender_of(m.subject) == COORDINATOR
            and (e.caller, e.received_ms, e.attempt) == this_attempt
        ),
        None,
    )
    if ended is None or not isinstance(reason := ended.detail.get("reason"), str):
        return None
    try:
        error = msgspec.convert(ended.detail.get("error"), ErrorInfo | None)
    except msgspec.ValidationError:
        error = None
    ran, attempts = ended.detail.get("ran"), ended.detail.get("attempts")
    return StoredEnd(
        reason,
        error,
        ran if isinstance(ran, bool) else None,
        attempts if type(attempts) is int and attempts >= 0 else None,
    )


def _letter_detail(
    reason: str, letter: DeadLetter, error: ErrorInfo | None, ran: bool | None
) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "reason": reason,
        "error": msgspec.to_builtins(error) if error else None,
    }
    if ran is not None:
        detail["ran"] = ran
    if letter.workflow is not None and letter.workflow.handled:  # its workflow's ending counts
        detail["handled"] = True
    detail["attempts"] = letter.attempts  # as the letter's and reply's (0: none began)
    if (task := letter.envelope) is not None:  # what the audit record summarises as its input
        detail["input"] = msgspec.to_builtins(summary_of_task(task))
    return detail


def _fitted(letter: DeadLetter, limit: int) -> tuple[DeadLetter, bytes]:
    """The letter cut down to ``limit`` bytes, marked ``truncated``: first the details of its
    trace, then the raw body, then the task's payload (what a large message carries), then
    the middle of its trace and at last all of it (a workflow signalled 15,000 times had a
    trace too large even bare, and its letter failed, and was tried again, for minutes;
    ``reach trace`` reads the whole)."""
    bare = [msgspec.structs.replace(event, detail={}) for event in letter.trace]
    ends = bare[:TRACE_ENDS] + bare[-TRACE_ENDS:] if len(bare) > 2 * TRACE_ENDS else bare
    cuts = (
        {"trace": bare},
        {"raw": letter.raw[:RAW_KEPT] + "…" if letter.raw else letter.raw},
        {"envelope": msgspec.structs.replace(letter.envelope, payload=None)}
        if letter.envelope
        else {},
        {"state": None, "headers": {}},
        {"trace": ends},
        {"trace": []},
    )
    letter = msgspec.structs.replace(letter, truncated=True)
    for cut in cuts:
        letter = msgspec.structs.replace(letter, **cut)
        data = envelopes.encode(letter)
        if len(data) <= limit:
            break
    return letter, data


def reported_raw(data: bytes) -> dict[str, Any]:
    """``raw`` (and ``truncated``) of an agent's report of an undecodable dispatch: a body
    near the server's largest message would not fit in the report once JSON-escaped."""
    raw = printable(data)
    if raw is None or len(raw) <= RAW_KEPT:
        return {"raw": raw}
    return {"raw": raw[:RAW_KEPT] + "…", "truncated": True}


def printable(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


def _letter_id(caller: str | None, message_id: str, received_ms: int) -> str:
    """A dead letter's dedup id: one per life of a caller's message (see :func:`runs_of`),
    as its events' are: a life dead-lettered again past the intake's duplicate window was
    dropped as a copy of the first life's letter (the DLQ's window is an hour)."""
    letter_id = f"dlq-{caller}.{message_id}" if caller else f"dlq-{message_id}"
    return f"{letter_id}-r{received_ms}" if received_ms > 0 else letter_id


async def record_settling(
    broker: Broker, letter: DeadLetter, event: str, *, sender: str | None, **detail: Any
) -> None:
    """Record ``event`` (``replayed`` or ``resolved``) about the letter's message: in its
    trace (``REACH_EVENTS``, a week), then in ``REACH_SETTLED``, as long as the letter is
    kept (the same bytes and dedup id). ``sender``: whose subject (default: an operator's).
    It names the letter it settles (``letter_at_ms``) and the life of the message id (its
    ``received_ms``): a later life dead-lettered again is a letter of its own, open."""
    sender = sender or OPERATOR
    detail = {**detail, "letter_at_ms": letter.at_ms}
    settling = Event(
        v=1,
        event=event,
        message_id=letter.message_id,
        trace_id=letter.trace_id,
        topic=letter.topic,
        attempt=max(1, letter.attempts),
        agent_id=sender,  # the subject's sender token, as every event names its publisher
        at_ms=now_ms(),
        detail=detail,
        received_ms=letter.envelope.received_ms if letter.envelope else 0,
        # The letter's caller: its trace shows the settling with that caller's message, and
        # to that caller (without, a second message of nobody's, run twice: an outside trial).
        caller=letter.envelope.caller if letter.envelope else None,
    )
    subject, data, headers = event_message(broker, settling, sender=sender)
    kept = broker.names.settled(event, letter.topic, letter.trace_id, letter.message_id, sender)
    try:
        await broker.publish(subject, data, headers=headers)
        try:
            await broker.publish(kept, data, headers=headers)
        except BrokerError as exc:  # recorded in the trace: what was done is not undone
            log.warning(
                "the letter's state is not kept in REACH_SETTLED, only in its trace (a week):"
                " is the stream provisioned (`reach provision`), and the worker allowed to"
                " write there (`reach auth push`)?",
                message_id=letter.message_id,
                error=str(exc),
            )
    except BrokerError as exc:
        raise ReachError(f"cannot record {event} for {letter.message_id}: {exc}") from exc
