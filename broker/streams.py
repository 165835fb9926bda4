"""Reading and editing what a stream stores: a subject's messages from the start, one
message by sequence, deleting and purging, per-subject counts.

Readers use a short-lived consumer that acknowledges nothing, so they change nothing on
the stream and any number can run at once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import translate, translated


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


async def read_stream(
    broker: Broker,
    stream: str,
    filter_subject: str,
    *,
    limit: int = 10_000,
    batch: int = 256,
    timeout: float = 2.0,
) -> list[StoredMessage]:
    """Every message of ``stream`` on ``filter_subject`` (wildcards allowed), oldest first."""
    config = api.ConsumerConfig(
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.ALL,
        inactive_threshold=30.0,
        mem_storage=True,
    )
    with translated(subject=filter_subject):
        sub = await broker.js.pull_subscribe(filter_subject, stream=stream, config=config)
    found: list[StoredMessage] = []
    try:
        with translated(subject=filter_subject):
            if (await sub.consumer_info()).num_pending == 0:
                return found
        while len(found) < limit:
            with translated(subject=filter_subject):
                messages = await sub.fetch(min(batch, limit - len(found)), timeout=timeout)
            found.extend(_consumed(m) for m in messages)
            if messages[-1].metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return found


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
    except nats.errors.Error as exc:
        raise translate(exc, subject=stream) from exc


async def purge_subject(broker: Broker, stream: str, subject: str) -> None:
    """Remove every message of ``stream`` on ``subject``."""
    with translated(subject=subject):
        await broker.js.purge_stream(stream, subject=subject)


async def subject_counts(broker: Broker, stream: str, filter_subject: str) -> dict[str, int]:
    """How many messages ``stream`` holds on each subject matching ``filter_subject``."""
    with translated(subject=filter_subject):
        info = await broker.js.stream_info(stream, subjects_filter=filter_subject)
    return dict(info.state.subjects or {})


async def _get(broker: Broker, stream: str, **where: object) -> StoredMessage | None:
    try:
        raw = await broker.js.get_msg(stream, **where)  # type: ignore[arg-type]
    except nats.js.errors.NotFoundError:
        return None
    except nats.errors.Error as exc:
        raise translate(exc, subject=stream) from exc
    return StoredMessage(
        stream_seq=raw.seq or 0,
        subject=raw.subject or "",
        data=raw.data or b"",
        headers=dict(raw.headers or {}),
        timestamp_ns=int(raw.time.timestamp() * 1e9) if raw.time else 0,
    )


def _consumed(msg: Msg) -> StoredMessage:
    meta = msg.metadata
    return StoredMessage(
        stream_seq=meta.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=dict(msg.headers or {}),
        timestamp_ns=int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0,
    )
