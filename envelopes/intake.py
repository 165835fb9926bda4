"""Turn what arrives on ``reach.task.<topic>`` into a :class:`Task`.

Two forms are accepted. A JSON object holding both ``v`` and ``kind`` is a full
envelope and is validated strictly. Anything else is a bare body (what
``nats pub reach.task.x '{"text": "hi"}'`` sends): it becomes the payload, and
the envelope fields come from the ``Nats-Msg-Id`` / ``Reach-*`` headers or
defaults.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import msgspec

from agentreach.envelopes import headers as h
from agentreach.envelopes import tracecontext
from agentreach.envelopes.codec import decode_json, decode_task
from agentreach.envelopes.errors import DecodeError
from agentreach.envelopes.messages import (
    DEFAULT_TTL_MS,
    MAX_REPLY_SUBJECT,
    MAX_TTL_MS,
    PRIORITIES,
    Priority,
    Task,
    is_reply_subject,
    is_token,
)

_DIGITS = re.compile(r"^[0-9]{1,12}$")
# Whether replies may go to a subject; the coordinator refuses its own namespace.
ReplyPolicy = Callable[[str], bool]


def is_envelope(document: object) -> bool:
    """Whether a decoded JSON document claims to be an envelope."""
    return isinstance(document, dict) and "v" in document and "kind" in document


def task_from_intake(
    data: bytes,
    headers: Mapping[str, str] | None,
    *,
    topic: str,
    received_ms: int,
    fallback_id: str,
    reply_allowed: ReplyPolicy | None = None,
) -> Task:
    """Decode or wrap an intake message.

    ``topic`` comes from the subject; ``fallback_id`` is the message id to use
    when a bare body carries no ``Nats-Msg-Id``; ``reply_allowed`` refuses reply
    subjects replies must not go to. Raises :class:`DecodeError` naming the field or
    header at fault.
    """
    _check_token(topic, "subject topic")
    document = decode_json(data)
    _refuse_kindless(document)
    if is_envelope(document):
        if isinstance(document, dict) and document.get("resolution") is not None:
            # Only the coordinator resolves: a sender's is dropped whatever its shape, not
            # judged (a made-up one was dead-lettered as a broken field: an outside trial).
            del document["resolution"]
            data = msgspec.json.encode(document)
        task = decode_task(data)
        if task.topic != topic:
            raise DecodeError(
                f"Envelope topic {task.topic!r} does not match subject topic {topic!r}"
                " - at `$.topic`"
            )
        _check_reply(task.reply_to, reply_allowed, "$.reply_to")
        extra = custom_headers(headers)
        header = (headers or {}).get(h.TRACEPARENT)
        traceparent = task.traceparent or tracecontext.normalized(header)
        return msgspec.structs.replace(
            task,
            headers={**extra, **task.headers},
            received_ms=task.received_ms or received_ms,
            traceparent=traceparent,
        )
    task = wrap_body(
        document, headers or {}, topic=topic, received_ms=received_ms, fallback_id=fallback_id
    )
    _check_reply(task.reply_to, reply_allowed, f"header {h.REPLY_TO}")
    return task


def _refuse_kindless(document: object) -> None:
    """An object with an envelope's ``v`` and ``message_id`` and no ``kind`` is an envelope
    that forgot it: taken as a bare body, the whole of it was the payload, its reply_to, ttl
    and ids went unread, and its sender waited for a reply that never came (an outside
    caller trial). A bare body has not both."""
    envelope_like = isinstance(document, dict) and {"v", "message_id"} <= document.keys()
    if envelope_like and "kind" not in document:
        raise DecodeError(
            'Object missing required field `kind` ("task"): one with `v` and `message_id`'
            " is a task envelope (a bare body has not both) - at `$`"
        )


def wrap_body(
    payload: object,
    headers: Mapping[str, str],
    *,
    topic: str,
    received_ms: int,
    fallback_id: str,
) -> Task:
    """Wrap a bare JSON body into a task, taking envelope fields from headers."""
    message_id = _token_header(headers, h.MSG_ID) or fallback_id
    traceparent = tracecontext.normalized(headers.get(h.TRACEPARENT))
    trace_id = _token_header(headers, h.TRACE_ID) or tracecontext.trace_id_of(traceparent)
    return Task(
        v=1,
        message_id=message_id,
        trace_id=trace_id or message_id,
        topic=topic,
        payload=payload,
        ttl_ms=_ttl_header(headers),
        reply_to=_reply_header(headers),
        priority=_priority_header(headers),
        created_at=received_ms,
        received_ms=received_ms,
        traceparent=traceparent,
        headers=custom_headers(headers),
    )


def custom_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers a sender chose (not ``Nats-*``, ``Reach-*`` nor ``traceparent``, which
    has a field of its own), for routing rules."""
    return {
        name: value
        for name, value in (headers or {}).items()
        if not name.startswith(("Nats-", "Reach-")) and name.lower() != h.TRACEPARENT
    }


def _token_header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None or value == "":
        return None
    _check_token(value, f"header {name}")
    return value


def _ttl_header(headers: Mapping[str, str]) -> int:
    raw = headers.get(h.TTL)
    if raw is None or raw == "":
        return DEFAULT_TTL_MS
    if not _DIGITS.match(raw) or not 0 < int(raw) <= MAX_TTL_MS:
        raise DecodeError(
            f"Expected a whole number of milliseconds from 1 to {MAX_TTL_MS}, got {raw!r}",
            path=f"header {h.TTL}",
        )
    return int(raw)


def _reply_header(headers: Mapping[str, str]) -> str | None:
    raw = headers.get(h.REPLY_TO)
    if not raw:
        return None
    if len(raw) > MAX_REPLY_SUBJECT:
        raise DecodeError(
            f"Expected a subject of at most {MAX_REPLY_SUBJECT} characters, got {len(raw)}",
            path=f"header {h.REPLY_TO}",
        )
    if not is_reply_subject(raw):
        raise DecodeError(
            f"Expected one NATS subject (no spaces, wildcards or $), got {raw!r}",
            path=f"header {h.REPLY_TO}",
        )
    return raw


def _check_reply(reply_to: str | None, allowed: ReplyPolicy | None, where: str) -> None:
    if reply_to and allowed is not None and not allowed(reply_to):
        raise DecodeError(
            f"Replies may not go to {reply_to!r}: a sender's replies go to its own box"
            " (<prefix>.reply.<sender>.<box>), and none into Agent-Reach's own subjects",
            path=where,
        )


def _priority_header(headers: Mapping[str, str]) -> Priority:
    raw = headers.get(h.PRIORITY)
    if raw is None or raw == "":
        return "P1"
    value = raw.strip().upper()
    for priority in PRIORITIES:
        if value == priority:
            return priority
    raise DecodeError(f"Expected one of P0, P1, P2, got {raw!r}", path=f"header {h.PRIORITY}")


def _check_token(value: str, where: str) -> None:
    if not is_token(value):
        raise DecodeError(
            f"Expected 1-128 characters of letters, digits, '_' or '-', got {value!r}",
            path=where,
        )
