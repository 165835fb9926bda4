"""Durable pull consumers: created or updated from a typed spec, read in batches of
:class:`~agentreach.broker.messages.Delivery`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.aio.msg
import nats.errors
import nats.js
import structlog
from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import BrokerError, honour_cancellation, translate, translated
from agentreach.broker.messages import Delivery

log = structlog.get_logger("broker.consume")


@dataclass(frozen=True, kw_only=True)
class ConsumerSpec:
    """A durable pull consumer, shared by every process that binds to the same name."""

    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    ack_wait_s: float = 30.0
    max_ack_pending: int = 1000
    max_deliver: int = -1
    inactive_threshold_s: float | None = None

    def config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subject=self.filter_subjects[0] if len(self.filter_subjects) == 1 else None,
            filter_subjects=list(self.filter_subjects) if len(self.filter_subjects) > 1 else None,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.max_ack_pending,
            max_deliver=self.max_deliver,
            inactive_threshold=self.inactive_threshold_s,
        )


class PullConsumer:
    """A pull subscription bound to a durable consumer."""

    def __init__(self, sub: nats.js.JetStreamContext.PullSubscription, spec: ConsumerSpec) -> None:
        self._sub = sub
        self.spec = spec

    async def fetch(self, size: int, *, wait_s: float = 1.0) -> list[Delivery]:
        """Up to ``size`` messages, or none after ``wait_s`` of idleness (never a timeout)."""
        return [Delivery(m) for m in await _fetch(self._sub, size, wait_s)]

    async def batches(self, *, size: int, wait_s: float = 1.0) -> AsyncIterator[list[Delivery]]:
        """Fetch forever, yielding each non-empty batch."""
        while True:
            honour_cancellation()
            if deliveries := await self.fetch(size, wait_s=wait_s):
                yield deliveries


async def bind(broker: Broker, spec: ConsumerSpec) -> PullConsumer:
    """Create or update the consumer, then bind a pull subscription to it."""
    with translated(subject=", ".join(spec.filter_subjects)):
        await broker.js.add_consumer(spec.stream, config=spec.config())
        sub = await broker.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
    return PullConsumer(sub, spec)


async def _fetch(
    sub: nats.js.JetStreamContext.PullSubscription, size: int, wait_s: float
) -> list[nats.aio.msg.Msg]:
    try:
        return await sub.fetch(size, timeout=wait_s)
    except (nats.errors.TimeoutError, TimeoutError):
        # nats-py raises both kinds for an idle wait, and one of them also when the
        # fetch is cancelled: a pending cancel must still stop the caller.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError from None
        return []
    except nats.errors.Error as exc:
        raise translate(exc) from exc


async def follow(
    broker: Broker,
    *,
    stream: str,
    filter_subjects: tuple[str, ...],
    since_ms: int,
    size: int = 256,
) -> AsyncIterator[Delivery]:
    """Every message on ``filter_subjects`` stored since ``since_ms``, then each new one.

    A private consumer that acknowledges nothing, so every process that follows
    sees every message. When it is lost (a server restart), it is made again from
    the next stream sequence, so nothing is skipped or seen twice.
    """
    start: dict[str, object] = {
        "deliver_policy": api.DeliverPolicy.BY_START_TIME,
        "opt_start_time": _rfc3339(since_ms),
    }
    while True:
        config = api.ConsumerConfig(
            filter_subject=filter_subjects[0] if len(filter_subjects) == 1 else None,
            filter_subjects=list(filter_subjects) if len(filter_subjects) > 1 else None,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            **start,  # type: ignore[arg-type]
        )
        with translated(subject=", ".join(filter_subjects)):
            sub = await broker.js.pull_subscribe("", stream=stream, config=config)
        consumer = PullConsumer(
            sub, ConsumerSpec(stream=stream, durable="", filter_subjects=filter_subjects)
        )
        try:
            async for deliveries in consumer.batches(size=size, wait_s=1.0):
                for delivery in deliveries:
                    start = {
                        "deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE,
                        "opt_start_seq": delivery.stream_seq + 1,
                    }
                    yield delivery
        except BrokerError as exc:
            log.warning("following a stream failed; starting again", stream=stream, error=str(exc))
            await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")
