"""Reading and editing what a stream stores: one message by sequence (or the next on a
subject), deleting and purging, per-subject counts. Many messages at once are read with
batched direct gets (:func:`agentreach.broker.direct.messages_on`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
from nats.js.api import RawStreamMsg

from agentreach.broker.client import Client
from agentreach.broker.errors import translate, translated

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker


# "no message found", "sequence not found": acknowledged or removed meanwhile.
_GONE = frozenset({10037, 10043})
# A delete of a message that is gone fails with "message delete failed" (10057), whose
# description says "no message found": an agent acknowledged it just before.
_DELETE_GONE = _GONE | {10057}


# What a direct get's answer adds to the message's own headers (which, Nats-Msg-Id among
# them, are kept): left out of a StoredMessage, which has them as its fields.
DIRECT_GET_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
    }
)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as the stream keeps it: ``timestamp_ns`` is the broker's clock."""

    stream_seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    timestamp_ns: int

    @property
    def timestamp_ms(self) -> int:
        return self.timestamp_ns // 1_000_000


async def get_message(broker: Broker, stream: str, seq: int) -> StoredMessage | None:
    """The message at ``seq``, or None when it is gone (acknowledged, deleted, expired)."""
    return await _get(broker, stream, seq=seq)


async def next_message(
    broker: Broker, stream: str, subject: str, *, from_seq: int = 1
) -> StoredMessage | None:
    """The first message on ``subject`` at or after ``from_seq``, or None."""
    return await _get(broker, stream, seq=from_seq, subject=subject, next=True)


async def delete_message(broker: Broker, stream: str, seq: int) -> bool:
    """Remove the message at ``seq``; False when it was gone already."""
    try:
        return await broker.js.delete_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        return False
    except nats.js.errors.APIError as exc:
        if exc.err_code in _DELETE_GONE:
            return False
        raise translate(exc, subject=stream) from exc
    except nats.errors.Error as exc:
        raise translate(exc, subject=stream) from exc


async def subject_counts(broker: Broker, stream: str, filter_subject: str) -> dict[str, int]:
    """How many messages ``stream`` holds on each subject matching ``filter_subject``."""
    with translated(subject=filter_subject):
        info = await broker.js.stream_info(stream, subjects_filter=filter_subject)
    return dict(info.state.subjects or {})


async def last_message(broker: Broker, stream: str, subject: str) -> StoredMessage | None:
    """The last message of ``stream`` on ``subject`` (wildcards allowed), or None: a direct
    get whose API subject names ``subject``, so permissions can grant reads of it alone."""
    return await _get(broker, stream, subject=subject, direct=True)


async def leader_message(broker: Broker, stream: str, subject: str) -> StoredMessage | None:
    """:func:`last_message` as the stream's leader has it: not a direct get, which any
    replica answers, one that is behind too (a node paused, or catching up after one)."""
    return await _get(broker, stream, subject=subject)


async def leader_next_message(
    broker: Broker, stream: str, subject: str, from_seq: int
) -> StoredMessage | None:
    """The first message of ``stream`` on ``subject`` (wildcards allowed) from ``from_seq``,
    as the stream's leader has it (a replica behind lacks messages stored a moment ago)."""
    return await _get(broker, stream, seq=from_seq, subject=subject, next=True)


async def _get(broker: Broker, stream: str, **where: object) -> StoredMessage | None:
    try:
        raw = await broker.js.get_msg(stream, **where)  # type: ignore[arg-type]
    except nats.js.errors.NotFoundError:
        return None
    except nats.js.errors.APIError as exc:
        if exc.err_code in _GONE:
            return None
        raise translate(exc, subject=stream) from exc
    except nats.errors.Error as exc:
        raise translate(exc, subject=stream) from exc
    direct = bool(where.get("direct"))
    return StoredMessage(
        stream_seq=raw.seq or 0,
        subject=raw.subject or "",
        data=raw.data or b"",
        headers=_own_headers(raw.headers or {}) if direct else _stored_headers(raw),
        timestamp_ns=int(raw.time.timestamp() * 1e9) if raw.time else 0,
    )


def _own_headers(headers: dict[str, str]) -> dict[str, str]:
    """The message's own headers: a direct get's answer adds the server's after them (a
    stored message holding such headers already is marked ``STORED_ANSWER`` by the client)."""
    return {k: v for k, v in headers.items() if k not in DIRECT_GET_HEADERS}


def _stored_headers(raw: RawStreamMsg) -> dict[str, str]:
    """The headers of a message read by ``STREAM.MSG.GET``, parsed as every other read
    parses them. nats-py parses that answer's block as an e-mail's, which ends at the first
    blank line: a party stored a block holding one, had a direct get copy it (the server adds
    its headers after the stored block) onto its own queue, and the coordinator's read saw
    none of them — it moved the forgery on as its own task, in another caller's name."""
    if not raw.hdrs:
        return {}
    block = base64.b64decode(raw.hdrs)
    return Client._parse_header_lines(block.partition(b"\r\n")[2])


async def consumer_backlog(broker: Broker, stream: str, durable: str) -> int | None:
    """Messages a durable consumer has not had acknowledged yet (pending plus unacknowledged);
    None when it does not exist."""
    try:
        info = await broker.js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return None
    except nats.errors.Error as exc:
        raise translate(exc, subject=stream) from exc
    return (info.num_pending or 0) + (info.num_ack_pending or 0)


async def stream_size(broker: Broker, stream: str) -> tuple[int, int]:
    """``(messages, last sequence)`` of a stream."""
    with translated(subject=stream):
        info = await broker.js.stream_info(stream)
    return info.state.messages, info.state.last_seq


async def stream_fill(broker: Broker, stream: str) -> tuple[int, int]:
    """``(bytes held, max_bytes)`` of a stream; max_bytes -1 when it has no byte limit."""
    with translated(subject=stream):
        info = await broker.js.stream_info(stream)
    return info.state.bytes or 0, info.config.max_bytes or -1


async def stream_bounds(broker: Broker, stream: str) -> tuple[int, int]:
    """``(first sequence, last sequence)`` of a stream: what it still keeps."""
    with translated(subject=stream):
        info = await broker.js.stream_info(stream)
    return info.state.first_seq, info.state.last_seq


async def per_subject_limit(broker: Broker, stream: str) -> int:
    """The most messages ``stream`` keeps on one subject (-1: no limit)."""
    with translated(subject=stream):
        info = await broker.js.stream_info(stream)
    return info.config.max_msgs_per_subject or -1


async def stream_created(broker: Broker, stream: str) -> object:
    """When ``stream`` was made: a store that came back empty made it again."""
    with translated(subject=stream):
        info = await broker.js.stream_info(stream)
    return info.created
