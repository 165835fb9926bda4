"""Durable pull consumers: created or updated from a typed spec, read in batches of
:class:`~agentreach.broker.messages.Delivery`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import nats.aio.msg
import nats.errors
import nats.js
from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import (
    BrokerError,
    ConsumerNotFound,
    StreamNotFound,
    Unavailable,
    honour_cancellation,
    pause,
    translate,
    translated,
)
from agentreach.broker.failover import until_answered
from agentreach.broker.messages import Delivery
from agentreach.broker.pauses import Pause
from agentreach.broker.pull import Puller
from agentreach.logs import get_logger

log = get_logger("broker.consume")


def _status_of(msg: nats.aio.msg.Msg | None) -> str | None:
    """nats-py's test for a server status message, made safe for stored messages.

    nats-py tells a status (no messages, timeout, heartbeat) from data by a ``Status``
    header alone, so a stored message carrying that header (anyone may set one with
    ``nats pub -H Status:500``) was dropped, or raised on every fetch and stalled the
    consumer. A stored message always comes with an ack subject; a status never does.
    """
    if msg is not None and (msg.reply or "").startswith("$JS.ACK."):
        return None
    return _nats_status_of(msg)


_nats_status_of = nats.js.JetStreamContext.is_status_msg
nats.js.JetStreamContext.is_status_msg = staticmethod(_status_of)  # type: ignore[method-assign]

RETRY_FIRST_S = 0.5
# A consumer paused by a leader election resumes within this of the new leader (with a 5 s cap
# a failover's flow came back up to 5.4 s after the elections); a try is one cheap request.
RETRY_CAP_S = 2.0
# The server's "can not be updated", of an ack or deliver policy, a start sequence.
NOT_UPDATABLE = 10012


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
    # Start at messages stored from now on (only when the consumer is first made; an
    # existing one resumes where it stopped): for views of history nobody asked to replay.
    new_only: bool = False
    # False: a delivered message is done (ack policy none), for consumers that only count.
    acknowledged: bool = True
    # Start at this stream sequence instead (only when first made): a new_only consumer
    # deleted under a running process is made again where that process left off.
    start_seq: int = 0

    def config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subject=self.filter_subjects[0] if len(self.filter_subjects) == 1 else None,
            filter_subjects=list(self.filter_subjects) if len(self.filter_subjects) > 1 else None,
            ack_policy=api.AckPolicy.EXPLICIT if self.acknowledged else api.AckPolicy.NONE,
            deliver_policy=self._deliver_policy(),
            opt_start_seq=self.start_seq or None,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.max_ack_pending,
            max_deliver=self.max_deliver,
            inactive_threshold=self.inactive_threshold_s,
        )

    def _deliver_policy(self) -> api.DeliverPolicy:
        if self.start_seq:
            return api.DeliverPolicy.BY_START_SEQUENCE
        return api.DeliverPolicy.NEW if self.new_only else api.DeliverPolicy.ALL


OnMissing = Callable[[str], Awaitable[None]]


class PullConsumer:
    """A pull subscription bound to a durable consumer, that keeps consuming through
    failures: a failed fetch is said once, retried after 0.5, 1, 2 … s (capped), and the
    consumer is made again when it is gone (``on_missing`` is asked to bring back a
    stream that is gone too)."""

    def __init__(
        self,
        broker: Broker,
        spec: ConsumerSpec,
        puller: Puller,
        *,
        on_missing: OnMissing | None = None,
    ) -> None:
        self._broker = broker
        self._puller = puller
        self._on_missing = on_missing
        self._pause = Pause(
            broker, "consuming paused; retrying", "consuming again", consumer=spec.durable
        )
        self._retry_s = RETRY_FIRST_S
        self._last_seq = 0  # the last stream sequence fetched
        self.spec = spec

    @property
    def failing(self) -> bool:
        """Whether fetching fails now (it is paused and retrying)."""
        return self._pause.on

    async def fetch(self, size: int, *, wait_s: float = 1.0) -> list[Delivery]:
        """Up to ``size`` messages as soon as there is one, or none after ``wait_s`` of
        idleness; raises BrokerError."""
        deliveries = [Delivery(m) for m in await self._puller.fetch(size, wait_s)]
        if deliveries:
            self._last_seq = max(self._last_seq, deliveries[-1].stream_seq)
        return deliveries

    async def next_batch(self, size: int, *, wait_s: float = 1.0) -> list[Delivery]:
        """Like :meth:`fetch`, but a failure is handled here: an empty batch after a pause."""
        try:
            deliveries = await self.fetch(size, wait_s=wait_s)
        except BrokerError as exc:
            await self._recover(exc)
            return []
        if self._pause.on:
            self._pause.ended()
            self._retry_s = RETRY_FIRST_S
        return deliveries

    async def batches(self, *, size: int, wait_s: float = 1.0) -> AsyncIterator[list[Delivery]]:
        """Fetch forever, yielding each non-empty batch."""
        while True:
            honour_cancellation()
            if deliveries := await self.next_batch(size, wait_s=wait_s):
                yield deliveries

    async def close(self) -> None:
        """Stop pulling; what was delivered and not yet handed out is given back at once."""
        await self._puller.close()

    async def _recover(self, exc: BrokerError) -> None:
        self._pause.failed(exc)
        await pause(self._retry_s)
        self._retry_s = min(RETRY_CAP_S, self._retry_s * 2)
        if isinstance(exc, Unavailable | ConsumerNotFound | StreamNotFound):
            await self._rebind()

    async def _rebind(self) -> None:
        """Make the consumer again (it is gone, or its stream is). One that starts at new
        messages starts after the last one fetched here: from now, the messages stored
        since it was deleted (by hand, say) would never be counted, silently. Another
        process's later fetches may come again (counted twice, fewer than a batch)."""
        spec = self.spec
        if spec.new_only and self._last_seq:
            spec = replace(spec, start_seq=self._last_seq + 1)
        try:
            puller = await _subscribe(self._broker, spec)
        except StreamNotFound:
            if self._on_missing is not None:
                await self._on_missing(f"stream {self.spec.stream} is gone")
            return
        except BrokerError:
            return  # still down: the next failure comes back here
        await self._puller.close()
        self._puller = puller


@dataclass(frozen=True, kw_only=True)
class ConsumerState:
    """A durable consumer as the server has it: its settings (as in :class:`ConsumerSpec`, with
    the policies by their API names) and how many messages it holds back. ``ack_floor_seq``:
    the stream sequence up to which every message is acknowledged; ``delivered_seq``: the
    last one it delivered."""

    spec: ConsumerSpec
    ack_policy: str
    deliver_policy: str
    num_ack_pending: int
    num_pending: int
    ack_floor_seq: int = 0
    delivered_seq: int = 0
    deliveries: int = 0  # every delivery it made, redeliveries included (its consumer seq)


async def consumer_state(broker: Broker, stream: str, durable: str) -> ConsumerState | None:
    """The consumer ``durable`` of ``stream``, or None when it does not exist."""
    try:
        info = await broker.js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return None
    except nats.errors.Error as exc:
        raise translate(exc, subject=f"{stream}/{durable}") from exc
    config = info.config
    filters = tuple(
        config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    )
    return ConsumerState(
        spec=ConsumerSpec(
            stream=stream,
            durable=config.durable_name or "",
            filter_subjects=filters,
            ack_wait_s=config.ack_wait or 0.0,
            max_ack_pending=config.max_ack_pending or 0,
            max_deliver=config.max_deliver or -1,
            inactive_threshold_s=config.inactive_threshold or None,
            acknowledged=config.ack_policy != api.AckPolicy.NONE,
        ),
        ack_policy=str(getattr(config.ack_policy, "value", config.ack_policy) or ""),
        deliver_policy=str(getattr(config.deliver_policy, "value", config.deliver_policy) or ""),
        num_ack_pending=info.num_ack_pending or 0,
        num_pending=info.num_pending or 0,
        ack_floor_seq=(info.ack_floor.stream_seq or 0) if info.ack_floor else 0,
        delivered_seq=(info.delivered.stream_seq or 0) if info.delivered else 0,
        deliveries=(info.delivered.consumer_seq or 0) if info.delivered else 0,
    )


async def set_ack_wait(broker: Broker, stream: str, durable: str, ack_wait_s: float) -> None:
    """Change the ack wait of the existing consumer ``durable``, its other settings kept (the
    conformance kit's redelivery of a message whose keep-alives did not arrive)."""
    subject = f"{stream}/{durable}"
    try:
        config = (await broker.js.consumer_info(stream, durable)).config
        config.ack_wait = ack_wait_s
        await broker.js.add_consumer(stream, config)
    except nats.errors.Error as exc:
        raise translate(exc, subject=subject) from exc


async def delete_consumer(broker: Broker, stream: str, durable: str) -> bool:
    """Delete the consumer ``durable`` of ``stream``; False when it did not exist. A work-queue
    stream keeps the messages it had not acknowledged: deleting drops no work."""
    try:
        return bool(await broker.js.delete_consumer(stream, durable))
    except nats.js.errors.NotFoundError:
        return False
    except nats.errors.Error as exc:
        raise translate(exc, subject=f"{stream}/{durable}") from exc


async def bind(
    broker: Broker,
    spec: ConsumerSpec,
    *,
    on_missing: OnMissing | None = None,
    patience_s: float | None = None,
) -> PullConsumer:
    """Create or update the consumer, then bind a pull subscription to it.

    A process starting during a leader election, or while most of the cluster's nodes are
    down, waits here (asking again after 1, 2, 4 … s, saying so each time) instead of
    exiting: for ever, or ``patience_s``, then Unavailable.
    """
    puller = await until_answered(
        lambda: _subscribe(broker, spec),
        waiting_for=f"consumer {spec.durable} of stream {spec.stream}",
        patience_s=patience_s,
    )
    return PullConsumer(broker, spec, puller, on_missing=on_missing)


async def _subscribe(broker: Broker, spec: ConsumerSpec) -> Puller:
    with translated(subject=", ".join(spec.filter_subjects)):
        try:
            await broker.js.add_consumer(spec.stream, config=spec.config())
        except nats.js.errors.ServerError as exc:
            if exc.err_code != NOT_UPDATABLE or not spec.new_only:
                raise
            await _made_otherwise(broker, spec)
    return await Puller(broker, spec.stream, spec.durable).open()


async def _made_otherwise(broker: Broker, spec: ConsumerSpec) -> None:
    """A consumer that starts at new messages exists with what cannot be updated set
    otherwise. Made again where a process left off (see PullConsumer._rebind), it keeps its
    start and takes the rest. Made by a version that acknowledged differently, it keeps no
    position worth a refusal: it is made again, from now."""
    held = (await broker.js.consumer_info(spec.stream, spec.durable)).config
    config = spec.config()
    if held.ack_policy == config.ack_policy:
        config.deliver_policy, config.opt_start_seq = held.deliver_policy, held.opt_start_seq
        await broker.js.add_consumer(spec.stream, config=config)
        return
    log.warning("consumer made again: its ack policy changed", consumer=spec.durable)
    await broker.js.delete_consumer(spec.stream, spec.durable)
    await broker.js.add_consumer(spec.stream, config=config)


async def follow(
    broker: Broker,
    *,
    stream: str,
    filter_subjects: tuple[str, ...],
    since_ms: int,
    size: int = 256,
    caught_up: asyncio.Event | None = None,
) -> AsyncIterator[Delivery]:
    """Every message on ``filter_subjects`` stored since ``since_ms``, then each new one;
    ``caught_up`` is set once what was stored when it began has been yielded.

    A private consumer that acknowledges nothing, so every process that follows
    sees every message. When it is lost (a server restart), it is made again from
    the next stream sequence, so nothing is skipped or seen twice.
    """
    start: dict[str, object] = {
        "deliver_policy": api.DeliverPolicy.BY_START_TIME,
        "opt_start_time": _rfc3339(since_ms),
    }
    paused = Pause(broker, "following a stream failed; retrying", "following again", stream=stream)
    while True:
        honour_cancellation()
        puller = None
        try:
            puller = await _follower(broker, stream, filter_subjects, start)
            paused.ended()
            while True:
                honour_cancellation()
                batch = [Delivery(m) for m in await puller.fetch(size, 1.0)]
                for delivery in batch:
                    start = {
                        "deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE,
                        "opt_start_seq": delivery.stream_seq + 1,
                    }
                    yield delivery
                if caught_up is not None and (not batch or batch[-1].pending == 0):
                    caught_up.set()
        except BrokerError as exc:
            paused.failed(exc)
            await pause(RETRY_FIRST_S * 2)
        finally:
            if puller is not None:
                await puller.close()


async def _follower(
    broker: Broker, stream: str, filter_subjects: tuple[str, ...], start: dict[str, object]
) -> Puller:
    config = api.ConsumerConfig(
        filter_subject=filter_subjects[0] if len(filter_subjects) == 1 else None,
        filter_subjects=list(filter_subjects) if len(filter_subjects) > 1 else None,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        **start,  # type: ignore[arg-type]
    )
    with translated(subject=", ".join(filter_subjects)):
        info = await broker.js.add_consumer(stream, config=config)
    return await Puller(broker, stream, info.name).open()


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")
