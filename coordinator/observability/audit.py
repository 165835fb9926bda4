"""Audit records: one per finished message, written to ``REACH_AUDIT``.

A durable consumer shared by every replica (``coordinator-audit``) takes each terminal
event (``completed``, ``dead_lettered``, ``workflow_completed``), reads the message's
events once, and publishes the record under ``Nats-Msg-Id: audit-<message_id>``: a
redelivered terminal event adds no second record, nor does an ending stored after another
(:mod:`~agentreach.coordinator.delivery.endings`: a completion and a dead letter of one
message raise an alert and resolve the letter); one that is not an event is dead-lettered
with its bytes. An ending sent in another agent's name
or by an agent the attempt was not routed to is refused with an ``alert`` (the outcomes
consumer leaves that check to it), and a record is built from the authentic events only, as
``reach trace`` shows them. It is apart from the metrics' consumer, so audit falling behind
never makes the counters late.
"""

from __future__ import annotations

import msgspec
import structlog

from agentreach.broker import Broker, Delivery
from agentreach.broker.lifecycle import events_of
from agentreach.broker.streams import StoredMessage
from agentreach.coordinator.delivery.dead_letters import unreadable_event
from agentreach.coordinator.delivery.endings import ENDINGS, earlier_ending, ended_again
from agentreach.coordinator.protection.grants import routing_vouches, vouched_sender
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.envelopes import (
    AuditRecord,
    DecodeError,
    ErrorInfo,
    Event,
    PayloadRef,
    Summary,
    decode_stored_event,
    encode,
    summarize,
)
from agentreach.envelopes.audit import Durations, Stage

log = structlog.get_logger("coordinator.audit")

TERMINAL = ENDINGS
# The events that start a phase. A phase lasts until the next one starts or the message
# ends, so the phases cover its whole life and add up to the total. An agent's `expired`
# report starts none: a task that expired in an agent's queue was queued until its dead
# letter. A failure that no routing followed (refused, exhausted, out of time) waits until
# its dead letter.
_PHASE_OF = {
    "routed": "queued",
    "accepted": "executing",
    "failed": "retry_wait",
    "retry_scheduled": "retry_wait",
    "workflow_started": "executing",  # a workflow's own message runs its steps
}


class AuditWriter:
    """The ``coordinator-audit`` consumer's handler."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._server_answers = ServerAnswers()

    async def handle(self, msg: Delivery) -> float | None:
        """None once the record is written (or refused), or seconds until the ending is
        looked at again."""
        try:
            ending = decode_stored_event(msg.data, msg.headers)
        except DecodeError as exc:
            await unreadable_event(self._broker, msg, exc, self._server_answers)
            return None
        broker, names = self._broker, self._broker.names
        if await vouched_sender(broker, msg.subject, ending) is None:
            return None  # a body claiming another agent: the alert is raised, no record kept
        events = await events_of(broker, ending.trace_id, ending.message_id)
        # An ending from an agent the attempt was not routed to writes no record: it is kept
        # for the real one (the first record of a message is its only one).
        if (vouched := await routing_vouches(broker, msg, ending, events)) is not True:
            return None if vouched is False else vouched
        run = events.run_at(names, msg.stream_seq)
        if (first := earlier_ending(run, msg.stream_seq)) is not None:
            await ended_again(broker, ending, first)  # the first ending's record stands
            return None
        record = audit_record(ending, msg.timestamp_ns / 1e6, run)
        subject = names.audit(record.status, ending.topic, ending.trace_id, ending.message_id)
        # One record per run: each caller's under a shared message id is its own.
        callers = {event.caller for _, event in run if event.event == "routed"} - {None}
        of = f"{min(callers)}." if len(callers) == 1 else ""
        headers = {"Nats-Msg-Id": f"audit-{of}{ending.message_id}"}
        await broker.publish(subject, encode(record), headers=headers)
        return None


def audit_record(
    ending: Event, ended_ms: float, stored: list[tuple[StoredMessage, Event]]
) -> AuditRecord:
    """The record of the message ``ending`` finished (stored at ``ended_ms``, the broker's
    time at full precision: a no-op run can start and end in one millisecond), from its
    stored (authentic) events."""
    events = [(message.timestamp_ns / 1e6, event) for message, event in stored]
    if not events:
        events = [(ended_ms, ending)]
    first_ms = events[0][0]
    received = ending.received_ms or first_ms
    shown = [(t, e) for t, e in events if e.event != "progress"]
    return AuditRecord(
        message_id=ending.message_id,
        trace_id=ending.trace_id,
        topic=ending.topic,
        priority=ending.priority,
        status="dead_lettered" if ending.event == "dead_lettered" else "completed",
        reason=ending.detail.get("reason") if ending.event == "dead_lettered" else None,
        received_ms=int(received),
        ended_ms=int(ended_ms),
        attempts=max(e.attempt for _, e in events),
        agents=list(
            dict.fromkeys(e.agent_id for _, e in events if e.event == "routed" and e.agent_id)
        ),
        durations=_durations(events, received, ended_ms),
        stages=[Stage(e.event, round(t - first_ms, 3), e.attempt, e.agent_id) for t, e in shown],
        progress_events=len(events) - len(shown),
        input=_input(events),
        output=_output(ending),
        error=_error(ending),
    )


def _durations(events: list[tuple[float, Event]], received: float, ended: float) -> Durations:
    """Each moment from ``received`` to ``ended`` in one phase: intake until the first event
    that starts a phase, then each phase until the next one starts, the last until the end."""
    spent = {"intake": 0.0, "queued": 0.0, "executing": 0.0, "retry_wait": 0.0}
    phase, since = "intake", received
    for at, event in sorted(events, key=lambda pair: pair[0]):
        starts = _PHASE_OF.get(event.event)
        if starts is None:
            continue
        # An event stored after the ending (a cluster can) adds nothing.
        at = max(since, min(at, ended))
        spent[phase] += at - since
        phase, since = starts, at
    spent[phase] += max(0.0, ended - since)
    return Durations(
        total=round(max(0.0, ended - received), 3), **{k: round(v, 3) for k, v in spent.items()}
    )


def _input(events: list[tuple[float, Event]]) -> Summary | None:
    for _, event in events:
        if event.event in ("routed", "dead_lettered") and isinstance(
            event.detail.get("input"), dict
        ):
            try:
                return msgspec.convert(event.detail["input"], Summary)
            except msgspec.ValidationError:
                return None
    return None


def _output(ending: Event) -> Summary | None:
    if ending.event == "dead_lettered":
        return None
    ref = ending.detail.get("result_ref")
    if isinstance(ref, dict):
        try:
            return summarize(None, ref=msgspec.convert(ref, PayloadRef))
        except msgspec.ValidationError:
            return None
    return summarize(ending.detail.get("result"))


def _error(ending: Event) -> ErrorInfo | None:
    error = ending.detail.get("error")
    if not isinstance(error, dict):
        return None
    try:
        return msgspec.convert(error, ErrorInfo)
    except msgspec.ValidationError:
        return None
