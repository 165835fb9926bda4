"""Audit records: one compact record per finished message, kept in ``REACH_AUDIT``.

A record holds no payload: an input and output *summary* (size, SHA-256 and a short
preview), the stages the message went through with their offsets, the time spent in each
phase, the status and the agents. Large payloads themselves are in the Object Store
(``ref``) for as long as it keeps them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from agentreach.envelopes.messages import ErrorInfo, PayloadRef, Priority, Task

PREVIEW_CHARS = 200
_encoder = msgspec.json.Encoder()


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """What a payload or result was, without keeping it: its encoded size, its digest, the
    first characters of its JSON, and where it is kept when it was claim-checked."""

    bytes: int
    sha256: str
    preview: str = ""
    ref: PayloadRef | None = None


def summarize(value: Any, *, ref: PayloadRef | None = None) -> Summary:
    """The summary of a JSON value (or of the object ``ref`` points to)."""
    if ref is not None:
        return Summary(bytes=ref.size, sha256=ref.sha256, preview="", ref=ref)
    data = _encoder.encode(value)
    text = data[: PREVIEW_CHARS * 4].decode("utf-8", errors="ignore")
    preview = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return Summary(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), preview=preview)


def summary_of_task(task: Task) -> Summary:
    """The summary of a task's input."""
    return summarize(task.payload, ref=task.payload_ref)


class Stage(msgspec.Struct, frozen=True, array_like=True):
    """``[event, offset_ms, attempt, agent]``: one lifecycle event, from the first one."""

    event: str
    offset_ms: float
    attempt: int
    agent: str | None


class Durations(msgspec.Struct, frozen=True, kw_only=True):
    """Milliseconds by phase, all from the broker's timestamps."""

    total: float = 0.0  # intake (or the first stage) to the end: the reach latency
    # The four phases add up to ``total`` (docs/metrics.md says where each starts and ends):
    intake: float = 0.0  # receipt to the first routing (or the end, when never routed)
    queued: float = 0.0  # routed to accepted (or the end: expired in a queue), summed
    executing: float = 0.0  # accepted to completed or failed, summed
    retry_wait: float = 0.0  # failed to the next routing (or the end), summed


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True, tag="audit", tag_field="kind"):
    """On ``reach.audit.<status>.<topic>.<trace_id>.<message_id>`` in ``REACH_AUDIT``."""

    v: Literal[1] = 1
    message_id: str
    trace_id: str
    topic: str
    priority: Priority = "P1"
    traceparent: str | None = None
    status: Literal["completed", "dead_lettered"]
    reason: str | None = None  # the dead-letter reason
    received_ms: int = 0
    ended_ms: int = 0
    attempts: int = 1
    agents: list[str] = []
    durations: Durations = Durations()
    stages: list[Stage] = []
    progress_events: int = 0  # progress is collapsed into a count
    input: Summary | None = None
    output: Summary | None = None
    error: ErrorInfo | None = None
