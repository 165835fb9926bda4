"""Time-ordered identifiers (UUIDv7, RFC 9562)."""

from __future__ import annotations

import hashlib
import os
import time
import uuid


def new_id() -> str:
    """A fresh UUIDv7: sorts by creation time, unique without coordination."""
    return _uuid7(time.time_ns() // 1_000_000, int.from_bytes(os.urandom(10)))


def stable_id(timestamp_ns: int, *parts: object) -> str:
    """A UUIDv7 whose time is ``timestamp_ns`` and whose random bits come from ``parts``.

    Used where an id must be the same on every redelivery of one broker message
    (for example a bare body with no ``Nats-Msg-Id``): derive it from the stream
    name and sequence, and a coordinator that crashes and sees the message again
    assigns the same id, so downstream deduplication still holds.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=10).digest()
    return _uuid7(timestamp_ns // 1_000_000, int.from_bytes(digest))


def replay_id(
    at_ms: int,
    caller: str | None,
    message_id: str,
    replays: int,
    *,
    to_topic: str | None = None,
    payload_sha256: str | None = None,
) -> str:
    """The message id of the one unforced replay of a dead letter (protocol §15.2): a UUIDv7
    whose time is the letter's ``at_ms`` and whose random bits are the first 80 of the
    SHA-256 of ``reach-replay``, ``caller`` (empty without one), ``message_id`` and the
    letter's ``replays`` (and ``to_topic``, for a replay to another topic than the task's;
    ``payload:`` and the hex SHA-256 of its payload's JSON, for a replay with another
    payload), NUL-separated, in UTF-8. Any worker, in any language, computes the same id for
    the same letter, so replays of it that race are one message; one sent elsewhere, or with
    another payload, is another."""
    parts = ["reach-replay", caller or "", message_id, str(replays)]
    if to_topic is not None:
        parts.append(to_topic)
    if payload_sha256 is not None:
        parts.append(f"payload:{payload_sha256}")
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()[:10]
    return _uuid7(at_ms, int.from_bytes(digest))


def sub_task_id(parent_id: str, created_at_ms: int, sender: str, key: str) -> str:
    """The message id of the sub-task ``key`` that ``sender`` (an agent) sends for message
    ``parent_id`` (created at ``created_at_ms``, the parent envelope's ``created_at``): a
    UUIDv7 with that time whose random bits are the first 80 of the SHA-256 of
    ``reach-sub-task``, ``parent_id``, ``sender`` and ``key``, NUL-separated. The handler run
    again by the same agent (redelivered, retried there) sends its sub-tasks under the same
    ids, so each runs once; another agent the parent moves to sends its own (an id is one
    caller's: the same id from another is refused as ``duplicate_id``)."""
    parts = ["reach-sub-task", parent_id, sender, key]
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return _uuid7(created_at_ms, int.from_bytes(digest[:10]))


def unix_ms_of(message_id: str) -> int:
    """The time a UUIDv7 id carries, in Unix milliseconds; 0 for any other id."""
    try:
        value = uuid.UUID(message_id)
    except ValueError:
        return 0
    return value.int >> 80 if value.version == 7 else 0


def _uuid7(unix_ms: int, rand80: int) -> str:
    rand_a = (rand80 >> 68) & 0xFFF
    rand_b = rand80 & ((1 << 62) - 1)
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= rand_a << 64
    value |= 0b10 << 62
    value |= rand_b
    return str(uuid.UUID(int=value))
