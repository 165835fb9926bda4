"""Publishing what happens to a message: lifecycle events and dead letters.

Both are deduplicated by ``Nats-Msg-Id``, so a process that crashes after
publishing and does its work again does not record it twice.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.broker.connection import Broker
from agentreach.broker.direct import read_stream
from agentreach.broker.messages import Delivery
from agentreach.envelopes import DeadLetter, ErrorInfo, Event, Task, now_ms, stable_id
from agentreach.envelopes.audit import summary_of_task


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
    fields = about(about_, event=event, agent_id=agent_id, detail=detail)
    fields["at_ms"] = fields.pop("created_at")
    return Event(**fields, priority=about_.priority, received_ms=about_.received_ms)


HEADROOM = 4096  # for a dead letter's headers and framing under the server's max payload
RAW_KEPT = 65_536  # characters of an oversized raw body a dead letter keeps
AGENT_TOPIC = "_agent"  # the topic of events about an agent rather than a task
# Events that may come many times for one attempt, each one counting.
REPEATABLE = frozenset({"progress", "signal_ignored"})


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


async def emit(broker: Broker, event: Event) -> None:
    """Publish ``event`` to ``reach.event.<event>.<topic>.<trace_id>.<message_id>``."""
    subject = broker.names.event(event.event, event.topic, event.trace_id, event.message_id)
    msg_id = f"{event.message_id}-{event.event}-{event.attempt}"
    if event.event in REPEATABLE:
        msg_id += f"-{event.at_ms}"
    elif event.event == "routed":  # an agent that refuses leads to routing again
        msg_id += f"-{event.agent_id}"
    await broker.publish(subject, envelopes.encode(event), headers={"Nats-Msg-Id": msg_id})


async def reply(broker: Broker, task: Task, message: envelopes.Reply) -> None:
    """Send an ack, progress, result or error to the task's ``reply_to``, if it has one."""
    if task.reply_to:
        headers = {
            "Reach-Trace-Id": task.trace_id,
            "Reach-Kind": str(type(message).__struct_config__.tag),
        }
        await broker.publish_core(task.reply_to, envelopes.encode(message), headers=headers)


async def trace_of(broker: Broker, message_id: str) -> list[Event]:
    """Every recorded event of ``message_id``, oldest first."""
    stored = await read_stream(
        broker, broker.names.events_stream, broker.names.events_of_message(message_id)
    )
    return [envelopes.decode_event(m.data) for m in stored]


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
) -> DeadLetter:
    """Publish a dead letter to ``reach.dlq.<reason>.<topic>`` with the trace so far,
    and record a ``dead_lettered`` event."""
    trace = await trace_of(broker, message_id)
    letter = DeadLetter(
        v=1,
        reason=reason,
        message_id=message_id,
        trace_id=trace_id,
        topic=topic,
        attempts=task.attempt if task else 0,
        envelope=task,
        raw=_printable(raw),
        headers=dict(headers or {}),
        error=error,
        trace=trace,
        at_ms=now_ms(),
        state=state,
    )
    data = envelopes.encode(letter)
    if len(data) > broker.max_payload - HEADROOM:
        letter, data = _fitted(letter, broker.max_payload - HEADROOM)
    await broker.publish(
        broker.names.dlq(reason, topic),
        data,
        headers={"Nats-Msg-Id": f"dlq-{message_id}", "Reach-Trace-Id": trace_id},
    )
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
            detail=_letter_detail(reason, task, error),
            priority=task.priority if task else "P1",
            received_ms=task.received_ms if task else 0,
        ),
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


def _letter_detail(reason: str, task: Task | None, error: ErrorInfo | None) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "reason": reason,
        "error": msgspec.to_builtins(error) if error else None,
    }
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


def _printable(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")
