"""Publishing what happens to a message: lifecycle events and dead letters.

Both are deduplicated by ``Nats-Msg-Id``, so a process that crashes after
publishing and does its work again does not record it twice.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.broker.connection import Broker
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.messages import Delivery
from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.runs import runs_of
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import (
    DeadLetter,
    ErrorInfo,
    ErrorReply,
    Event,
    Result,
    Task,
    now_ms,
    stable_id,
)
from agentreach.envelopes.audit import summary_of_task
from agentreach.envelopes.coordination import workflow_step_of
from agentreach.logs import get_logger

log = get_logger("broker.lifecycle")


def about(task: Task, **fields: Any) -> dict[str, Any]:
    """The fields every reply and event about ``task`` repeats (its ids, topic and attempt),
    stamped now; ``fields`` add to or override them."""
    return {
        "v": 1,
        "message_id": task.message_id,
        "trace_id": task.trace_id,
        "topic": task.topic,
        "attempt": task.attempt,
        "created_at": now_ms(),
        **fields,
    }


def event_for(about_: Task, event: str, /, *, agent_id: str | None = None, **detail: Any) -> Event:
    """An event about a task, carrying its ids, topic and attempt; ``detail`` is free-form."""
    fields = about(about_, event=event, agent_id=agent_id, caller=about_.caller, detail=detail)
    fields["at_ms"] = fields.pop("created_at")
    return Event(**fields, priority=about_.priority, received_ms=about_.received_ms)


# The coordinator's proof, on a dispatch, that the attempt was given to that agent.
GRANT_HEADER = "Reach-Grant"
SEAL_HEADER = "Reach-Seal"  # copied into the agent's execution record of the attempt
HEADROOM = 4096  # for a dead letter's headers and framing under the server's max payload
RAW_KEPT = 65_536  # characters of an oversized raw body a dead letter keeps
AGENT_TOPIC = "_agent"  # the topic of events about an agent rather than a task
# Events that may come many times for one attempt, each one counting.
REPEATABLE = frozenset({"progress", "signal_ignored"})
# What an agent says about a task it was given.
AGENT_TASK_EVENTS = frozenset(
    {"accepted", "progress", "completed", "failed", "expired", "late_result_rejected"}
)


def agent_event(agent_id: str, event: str, **detail: Any) -> Event:
    """An event about an agent (not a task): topic ``_agent``, trace = the agent id."""
    return Event(
        v=1,
        event=event,
        message_id=envelopes.new_id(),
        trace_id=agent_id,
        topic=AGENT_TOPIC,
        agent_id=agent_id,
        at_ms=now_ms(),
        detail=detail,
    )


async def emit(broker: Broker, event: Event, *, sender: str = COORDINATOR) -> None:
    """Publish ``event`` as ``sender`` (an agent or worker id; the coordinator by default) to
    ``reach.event.<event>.<topic>.<trace_id>.<message_id>.<sender>``."""
    subject, data, headers = event_message(broker, event, sender=sender)
    await broker.publish(subject, data, headers=headers)


def event_message(broker: Broker, event: Event, *, sender: str = COORDINATOR) -> Outgoing:
    """What :func:`emit` publishes, as a message for :meth:`Broker.publish_all`."""
    subject = broker.names.event(event.event, event.topic, event.trace_id, event.message_id, sender)
    headers = None
    if event.event not in REPEATABLE:
        # Dedup is stream-wide: with the sender in the id, nobody can pre-empt another's.
        msg_id = f"{event.message_id}-{event.event}-{event.attempt}-{sender}"
        if sender == COORDINATOR and event.caller:
            # Past the duplicate window another caller may send a message under the same
            # id: its run's events are its own, not duplicates of the first caller's.
            msg_id = f"{event.caller}.{msg_id}"
        if event.event == "routed":  # an agent that refuses leads to routing again
            msg_id += f"-{event.agent_id}"
        if event.event == "replayed":  # each forced replay of one letter is a replay of its own
            msg_id += f"-{event.detail.get('replayed_as')}"
        epoch = event.detail.get("epoch")
        if event.event == "accepted" and isinstance(epoch, int) and epoch > 0:
            msg_id += f"-{epoch}"  # each process that takes the attempt is seen to
        grant = event.detail.get("grant")
        if sender != COORDINATOR and isinstance(grant, str):
            # Only the coordinator and this agent know the grant: nobody can pre-empt the id.
            msg_id += f"-{grant[:16]}"
        headers = {"Nats-Msg-Id": msg_id}
    return Outgoing(subject, envelopes.encode(event), headers)


async def reply(
    broker: Broker, task: Task, message: envelopes.Reply, *, sender: str = COORDINATOR
) -> None:
    """Send an ack, progress, result, error or routed notice to the task's ``reply_to``, if
    it has one, as ``sender`` (see :meth:`Names.reply_subject`). A workflow's reply subject
    is sent only a result or an error."""
    if not task.reply_to:
        return
    final = isinstance(message, Result | ErrorReply)
    if not final and broker.names.workflow_replies(task.reply_to):
        return  # a workflow reads only a step's result or error, and every reply is stored
    headers = {
        "Reach-Trace-Id": task.trace_id,
        "Reach-Kind": str(type(message).__struct_config__.tag),
    }
    subject = broker.names.reply_subject(task.reply_to, sender)
    await broker.publish_core(subject, envelopes.encode(message), headers=headers)


async def trace_of(broker: Broker, message_id: str) -> list[Event]:
    """Every authentic recorded event of ``message_id``, oldest first (see :func:`authentic`)."""
    return await _authentic_on(broker, broker.names.events_of_message(message_id))


async def events_of_id(broker: Broker, wanted: str) -> list[Event]:
    """The events of the message ``wanted``, or else of the trace ``wanted``, oldest first."""
    if found := await trace_of(broker, wanted):
        return found
    # An agent's own events carry its id as their trace: not a message of a trace.
    traced = await _authentic_on(broker, broker.names.events_of_trace(wanted))
    return [event for event in traced if event.topic != AGENT_TOPIC]


async def _authentic_on(broker: Broker, subject: str) -> list[Event]:
    # Through the subject index: a wildcard read by message id looks at every event stored.
    stored = await indexed_messages_on(broker, broker.names.events_stream, subject)
    return [event for _, event in authentic(broker.names, stored)]


# An event is judged unrouted only after this many looks, a second apart: the `routed` event
# and the dispatch are written to two streams, and in a cluster the dispatch (and the agent's
# answer) may be stored before `routed` is, while the events stream elects a leader.
UNROUTED_LOOKS = 3
UNROUTED_LOOK_AGAIN_S = 1.0


@dataclass(frozen=True, slots=True)
class MessageEvents:
    """What is stored of one message's events, and which of them are authentic."""

    stored: list[StoredMessage]
    authentic: list[tuple[StoredMessage, Event]]

    def vouch_for(self, stream_seq: int) -> bool:
        """Whether the event stored at ``stream_seq`` is authentic (one the stream holds no
        more cannot be checked against the routing, only by its sender token)."""
        if all(m.stream_seq != stream_seq for m in self.stored):
            return True
        return any(m.stream_seq == stream_seq for m, _ in self.authentic)


async def events_of(broker: Broker, trace_id: str, message_id: str) -> MessageEvents:
    """The stored events of one message, read through the subject index (by trace too: a
    read by message id alone looks at every event in the stream)."""
    names = broker.names
    subject = names.events_of_message_in_trace(trace_id, message_id)
    stored = await indexed_messages_on(broker, names.events_stream, subject)
    return MessageEvents(stored, authentic(names, stored))


def _letter_id(caller: str | None, message_id: str) -> str:
    """A dead letter's dedup id: one per caller's message (see :func:`runs_of`)."""
    return f"dlq-{caller}.{message_id}" if caller else f"dlq-{message_id}"


def authentic(names: Names, stored: list[StoredMessage]) -> list[tuple[StoredMessage, Event]]:
    """The events that are what they claim, oldest first: the coordinator's own, and an
    agent's about a task only when it was that agent the coordinator routed the attempt to
    (the sender token of each subject is unforgeable under permissions). Unreadable ones and
    the rest are left out, and said so in the log."""
    decoded: list[tuple[StoredMessage, Event, str]] = []
    for message in stored:
        try:
            event = envelopes.decode_event(message.data)
        except envelopes.DecodeError:
            continue
        sender = names.sender_of(message.subject)
        if sender != COORDINATOR and event.event != names.kind_of_event_subject(message.subject):
            continue  # a body of another kind than its subject's: permissions vouch for the subject
        decoded.append((message, event, sender))
    routed: dict[tuple[str, int], set[str]] = {}
    for _, event, sender in decoded:
        if event.event == "routed" and sender == COORDINATOR and event.agent_id:
            routed.setdefault((event.message_id, event.attempt), set()).add(event.agent_id)
    kept: list[tuple[StoredMessage, Event]] = []
    left_out: Counter[str] = Counter()
    for message, event, sender in decoded:
        if (why := _not_authentic(event, sender, routed)) is None:
            kept.append((message, event))
        else:
            left_out[why] += 1
    for why, count in left_out.items():
        log.warning("events left out", why=why, count=count)
    return kept


def _not_authentic(
    event: Event, sender: str, routed: dict[tuple[str, int], set[str]]
) -> str | None:
    """Why ``event`` is not what it claims; None when it is."""
    if sender == COORDINATOR:
        return None
    if event.agent_id not in (None, sender):
        return "their body names another agent than their sender"
    if event.event in AGENT_TASK_EVENTS and sender not in routed.get(
        (event.message_id, event.attempt), ()
    ):
        return (
            "no routed event gives their attempt to their sender"
            " (dispatched past the coordinator, or forged)"
        )
    return None


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
) -> DeadLetter:
    """Publish a dead letter to ``reach.dlq.<reason>.<topic>`` with the trace so far,
    and record a ``dead_lettered`` event (``truncated``: ``raw`` was cut before it came;
    ``caller``: who sent what did not decode into ``task``; ``ran``: as its error reply says).
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
    letter = DeadLetter(
        v=1,
        reason=reason,
        message_id=message_id,
        trace_id=trace_id,
        topic=topic,
        attempts=task.attempt if task else 0,
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
            detail=_letter_detail(reason, task, error, ran),
            priority=task.priority if task else "P1",
            received_ms=task.received_ms if task else 0,
        ),
    )
    await broker.publish(
        broker.names.dlq(reason, topic),
        data,
        headers={"Nats-Msg-Id": _letter_id(caller, message_id), "Reach-Trace-Id": trace_id},
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
    """Dead-letter a stored message that could not be handled as it is: its bytes, headers
    and subject go into the letter, under an id derived from its stream and sequence (the
    same on every redelivery, so it is recorded once)."""
    message_id = stable_id(delivery.timestamp_ns, delivery.stream, delivery.stream_seq)
    return await dead_letter(
        broker,
        reason=reason,
        message_id=message_id,
        trace_id=trace_id or message_id,
        topic=topic,
        error=error,
        raw=delivery.data,
        headers={**delivery.headers, "Reach-Subject": delivery.subject},
    )


def _letter_detail(
    reason: str, task: Task | None, error: ErrorInfo | None, ran: bool | None
) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "reason": reason,
        "error": msgspec.to_builtins(error) if error else None,
    }
    if ran is not None:
        detail["ran"] = ran
    if task is not None:  # what the audit record of the message summarises as its input
        detail["input"] = msgspec.to_builtins(summary_of_task(task))
    return detail


def _fitted(letter: DeadLetter, limit: int) -> tuple[DeadLetter, bytes]:
    """The letter cut down to ``limit`` bytes, marked ``truncated``: first the details of its
    trace, then the raw body, then the task's payload (what a large message carries)."""
    bare = [msgspec.structs.replace(event, detail={}) for event in letter.trace]
    cuts = (
        {"trace": bare},
        {"raw": letter.raw[:RAW_KEPT] + "…" if letter.raw else letter.raw},
        {"envelope": msgspec.structs.replace(letter.envelope, payload=None)}
        if letter.envelope
        else {},
        {"state": None, "headers": {}},
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
