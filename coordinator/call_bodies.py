"""A ``reach.call`` request's body as the coordinator publishes it, and what the call reads
of it (the id, ttl and execute budget it waits by, the payload's digest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentreach import envelopes
from agentreach.envelopes import MAX_TTL_MS, Budget, DecodeError, is_envelope, summarize


@dataclass(frozen=True, slots=True)
class Addressed:
    """A call's body as it is published, and what the call reads of it."""

    data: bytes
    execute_ms: int  # the task's execute budget
    message_id: str | None = None  # a full envelope's own
    ttl_ms: int | None = None  # a full envelope's own
    sha256: str | None = None  # of its payload (None: not JSON, intake refuses it)


def addressed(data: bytes, reply_to: str) -> Addressed:
    """The body a call publishes, with what it reads of it: a full envelope answers to
    ``reply_to`` and may carry its id, ttl and budget; a bare body gets ``reply_to`` from
    the header and the defaults, and so does a malformed one (intake refuses it, and
    answers)."""
    try:
        document = envelopes.decode_json(data)
    except DecodeError:
        return Addressed(data, Budget().execute_ms)
    if not is_envelope(document):
        return Addressed(data, Budget().execute_ms, sha256=summarize(document).sha256)
    document["reply_to"] = reply_to
    budget = document.get("budget")
    execute_ms = positive_ms(budget.get("execute_ms") if isinstance(budget, dict) else None)
    own_id = document.get("message_id")
    return Addressed(
        envelopes.encode(document),
        execute_ms or Budget().execute_ms,
        message_id=own_id if isinstance(own_id, str) else None,
        ttl_ms=positive_ms(document.get("ttl_ms")),
        sha256=payload_digest(document),
    )


def payload_digest(envelope: dict[str, Any]) -> str | None:
    """The SHA-256 of an envelope's payload, as the routed event's ``input`` has it."""
    ref = envelope.get("payload_ref")
    if ref is None:
        return summarize(envelope.get("payload")).sha256
    digest = ref.get("sha256") if isinstance(ref, dict) else None
    return digest if isinstance(digest, str) else None


def positive_ms(value: object) -> int | None:
    """A positive number of ms up to a day, or None."""
    return value if isinstance(value, int) and 0 < value <= MAX_TTL_MS else None
