"""Read what a stream holds on some subjects, from the start, then stop."""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
import nats.errors
import nats.js
import nats.js.errors
from agentreach.broker.errors import translated
from agentreach.broker.watch import snapshot
from nats.js import api
from nats.js.kv import KeyValue

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as the stream keeps it: ``timestamp_ns`` is the broker's clock."""

    stream_seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    timestamp_ns: int


async def read_stream(
    js: nats.js.JetStreamContext,
    stream: str,
    filter_subject: str,
    *,
    limit: int = 10_000,
    batch: int = 256,
    timeout: float = 2.0,
) -> list[StoredMessage]:
    """Every message of ``stream`` on ``filter_subject`` (wildcards allowed), oldest first.

    Uses a short-lived ephemeral consumer that acknowledges nothing, so it changes
    nothing on the stream and any number of readers can run at once.
    """
    config = api.ConsumerConfig(
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.ALL,
        inactive_threshold=30.0,
        mem_storage=True,
    )
    with translated(subject=filter_subject):
        sub = await js.pull_subscribe(filter_subject, stream=stream, config=config)
    found: list[StoredMessage] = []
    try:
        with translated(subject=filter_subject):
            if (await sub.consumer_info()).num_pending == 0:
                return found
        while len(found) < limit:
            with translated(subject=filter_subject):
                messages = await sub.fetch(min(batch, limit - len(found)), timeout=timeout)
            found.extend(_stored(m) for m in messages)
            if messages[-1].metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return found


def _stored(msg: nats.aio.msg.Msg) -> StoredMessage:
    meta = msg.metadata
    return StoredMessage(
        stream_seq=meta.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=dict(msg.headers or {}),
        timestamp_ns=int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0,
    )


@dataclass(frozen=True, slots=True)
class StoredValue(Generic[T]):
    """A KV value decoded, with the broker's time of writing it."""

    value: T
    written: dt.datetime | None


async def read_bucket(kv: KeyValue, kind: type[T]) -> dict[str, StoredValue[T]]:
    """Every key's value decoded as ``kind`` (values not of that kind are left out): a
    snapshot for people to read, through one watch."""
    found: dict[str, StoredValue[T]] = {}
    for change in await snapshot(kv):
        try:
            found[change.key] = StoredValue(
                msgspec.json.decode(change.value or b"", type=kind), change.written
            )
        except msgspec.DecodeError:
            continue
    return found
