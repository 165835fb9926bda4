"""The NATS header names an envelope is mirrored into, so tools that read only
headers (``nats pub -H``, ``nats stream view``, JetStream deduplication) see them."""

from __future__ import annotations

from agentreach.envelopes.messages import Task

MSG_ID = "Nats-Msg-Id"
TRACE_ID = "Reach-Trace-Id"
MESSAGE_ID = "Reach-Message-Id"  # on a reach.call answer: the id its task is recorded under
PRIORITY = "Reach-Priority"
TTL = "Reach-TTL"
REPLY_TO = "Reach-Reply-To"
KIND = "Reach-Kind"
TRACEPARENT = "traceparent"  # W3C Trace Context


def task_headers(task: Task, *, msg_id: str | None = None) -> dict[str, str]:
    """Headers for publishing ``task``; ``msg_id`` overrides the dedup key."""
    headers = {
        MSG_ID: msg_id or task.message_id,
        TRACE_ID: task.trace_id,
        PRIORITY: task.priority,
        TTL: str(task.ttl_ms),
        KIND: "task",
    }
    if task.reply_to:
        headers[REPLY_TO] = task.reply_to
    if task.traceparent:
        headers[TRACEPARENT] = task.traceparent
    return headers


def control_headers(kind: str) -> dict[str, str]:
    """Headers of a workflow ``cancel`` or ``signal``: saying what it is, so that it is not
    an empty message without headers, which is what a stream keeps of a NATS status message
    that someone aimed at the subject (see :mod:`agentreach.envelopes.server_answers`)."""
    return {KIND: kind}


def msg_id_differs(headers: dict[str, str] | None, message_id: str) -> str | None:
    """Why a sender's ``Nats-Msg-Id`` is refused (it is not the body's ``message_id``: the
    stream drops a duplicate by the header, the coordinator and the agents know the message
    by the body), or None."""
    header = (headers or {}).get(MSG_ID)
    if header is None or header == message_id:
        return None
    return (
        f"header {MSG_ID} {header!r} is not the message_id {message_id!r}: the stream drops a"
        " message sent again by the header, so the two must be equal"
    )
