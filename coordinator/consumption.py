"""How the coordinator consumes its streams: each message is handled, then settled (or,
for the metrics, counted as it comes: :meth:`Consumption.fold`).

Up to a batch of messages is in hand at once, each settled on its own, and kept alive while
it is handled (the ack waits are short: what a dead replica held comes back soon). A handler returns
None when the message is done (acknowledged) or the seconds after which it should come
back (a wait, a backoff, a timer). A broker failure leaves the
message to come back a second later; a stream or bucket that has gone is provisioned
again. A message whose handling keeps crashing (a bug, or an input nobody foresaw) is
dead-lettered as ``poison`` after a few tries, so it never loops forever (a task's
sender is answered, and finds the letter in its trace); every consumer also has a
delivery limit, at whose last delivery a message wanted back is ended here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from agentreach.broker import (
    Broker,
    BrokerError,
    BrokerTimeout,
    Delivery,
    NoStreamError,
    Provisioner,
    PullConsumer,
    StreamFull,
    StreamNotFound,
)
from agentreach.broker.dead_letters import dead_letter_delivery
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.envelopes import ErrorInfo, Task

log = structlog.get_logger("coordinator")

Handler = Callable[[Delivery], Awaitable[float | None]]
# The task a delivery holds, as its handler would take it in (or None): its sender is
# answered when the message turns out to be poison.
TaskOf = Callable[[Delivery], Task | None]


class Counter(Protocol):
    """What a fold counts with (:meth:`Consumption.fold`)."""

    async def look_up(self, deliveries: Sequence[Delivery]) -> None:
        """Read what counting ``deliveries`` needs and this fold has not seen."""

    def count(self, delivery: Delivery) -> None: ...

    def caught_up(self) -> None: ...

    async def ready(self) -> None: ...


RETRY_DELAY_S = 1.0
FULL_SAID_EVERY_S = 60.0  # a full stream is said at most this often
POISON_AFTER = 3  # crashes before a message is dead-lettered as poison
REMEMBERED = 10_000  # messages whose crashes are counted at once


class Consumption:
    """Runs one consumer's messages through a handler, settling each exactly once."""

    def __init__(self, broker: Broker, provisioner: Provisioner) -> None:
        self._broker = broker
        self._provisioner = provisioner
        self._crashes: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._failing_since: float | None = None  # broker errors said once per outage
        self._full_said_at = -FULL_SAID_EVERY_S

    async def run(
        self, consumer: PullConsumer, batch: int, handle: Handler, task_of: TaskOf | None = None
    ) -> None:
        """Consume until cancelled, with at most ``batch`` messages in hand: each is settled
        as soon as it is handled, and its room pulled for again at once, so one slow message
        (a rate limit's wait, a leader election) holds up no other. ``task_of``: the task a
        message holds, whose sender a poison message's end is told."""
        in_hand: set[asyncio.Task[None]] = set()
        keep_alive_s, last = consumer.spec.ack_wait_s / 2, consumer.spec.max_deliver
        try:
            while True:
                honour_cancellation()
                if len(in_hand) >= batch:
                    await asyncio.wait(in_hand, return_when=asyncio.FIRST_COMPLETED)
                    continue
                for delivery in await consumer.next_batch(batch - len(in_hand)):
                    settling = asyncio.create_task(
                        self.settle(delivery, handle, keep_alive_s, task_of, last_delivery=last)
                    )
                    in_hand.add(settling)
                    settling.add_done_callback(in_hand.discard)
        finally:
            await cancel_and_wait(*in_hand)

    async def fold(self, consumer: PullConsumer, batch: int, counter: Counter) -> None:
        """Consume a consumer that acknowledges nothing (its deliveries are done), counting
        each message as it comes, in order: no task, no ack, no round trip per message,
        once ``counter`` is ready; it is told when a fetch finds nothing (another replica
        took the rest).

        For folds that only count (the metrics): what a dying replica had fetched and not
        yet counted is lost, less than the counts it had made since it was last scraped.
        A message that cannot be counted is said, with the reason, and left in its stream.
        """
        await counter.ready()
        while True:
            honour_cancellation()
            deliveries = await consumer.next_batch(batch)
            if not deliveries and not consumer.failing:
                counter.caught_up()
            try:
                await counter.look_up(deliveries)
            except Exception:  # counted all the same: a report whose routing was not read counts
                log.exception("what counting a batch needs could not be read")
            for delivery in deliveries:
                try:
                    counter.count(delivery)
                except Exception:
                    log.exception(
                        "a message could not be counted",
                        subject=delivery.subject,
                        stream_seq=delivery.stream_seq,
                    )

    async def settle(
        self,
        delivery: Delivery,
        handle: Handler,
        keep_alive_s: float | None = None,
        task_of: TaskOf | None = None,
        *,
        last_delivery: int = -1,
    ) -> None:
        """Handle ``delivery`` and settle it; while a handling outlasts ``keep_alive_s`` the
        message is said to be in progress, so that the ack wait can be short: a replica that
        dies holding a message gives it up after the ack wait, not after the task's ttl.
        At the consumer's ``last_delivery`` a message wanted back is ended here: the server
        would deliver it no more. (Its max-deliveries advisory said so before; one copied
        from an agent's own JSON cannot be told from it, and ended other callers' waiting
        tasks and deleted workflow timers: a security re-test.)"""
        try:
            if keep_alive_s is None:
                retry_in_s = await handle(delivery)
            else:
                async with delivery.kept_alive(keep_alive_s):
                    retry_in_s = await handle(delivery)
        except (NoStreamError, StreamNotFound, BrokerTimeout) as exc:
            # A stream may be gone (a timeout too: a subscriber on its subjects, such as
            # `nats sub`, turns "no stream" into silence): make sure (one request while
            # nothing is missing), then try again.
            await self._provisioner.ensure(str(exc))
            await self._later(delivery, exc)
            return
        except BrokerError as exc:  # a leader election that outlasted the write's patience
            await self._later(delivery, exc)
            return
        except Exception as exc:  # a bug must not stop the service, nor loop forever
            await self._crashed(delivery, exc, task_of)
            return
        self._recovered()
        if retry_in_s is not None and 0 < last_delivery <= delivery.num_delivered:
            at = delivery.position
            said = f"delivered {at.delivered} times to {at.consumer} without an acknowledgement"
            error = ErrorInfo(type="max_deliveries", message=said, retryable=False)
            await self._ended(delivery, "retries_exhausted", error, task_of)
            return
        with contextlib.suppress(BrokerError):  # unsettled, it comes back after the ack wait
            if retry_in_s is None:
                await delivery.ack()
            else:
                await delivery.nak(retry_in_s)

    async def _later(self, delivery: Delivery, exc: BrokerError) -> None:
        """The message comes back in a second; said once per run of failures, not per message
        (a leader election fails every message of a batch for seconds), and a full stream
        once a minute (the messages that need no room in it go on meanwhile)."""
        now = asyncio.get_running_loop().time()
        if isinstance(exc, StreamFull):
            if now - self._full_said_at >= FULL_SAID_EVERY_S:
                self._full_said_at = now
                log.warning(
                    "a stream is full: what needs room in it waits and is tried again; raise"
                    " its `limits:` key (README: Storage limits)",
                    error=str(exc),
                )
        elif self._failing_since is None:
            self._failing_since = now
            log.warning("broker errors; messages will be retried", error=str(exc))
        else:
            log.debug("broker error, will retry", subject=delivery.subject, error=str(exc))
        with contextlib.suppress(BrokerError):
            await delivery.nak(RETRY_DELAY_S)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            failed_s = asyncio.get_running_loop().time() - self._failing_since
            self._failing_since = None
            log.info("handling messages again", failed_s=round(failed_s, 1))

    async def _crashed(self, delivery: Delivery, exc: Exception, task_of: TaskOf | None) -> None:
        key = (delivery.stream, delivery.stream_seq)
        crashes = self._crashes.pop(key, 0) + 1
        if crashes < POISON_AFTER:
            self._crashes[key] = crashes
            while len(self._crashes) > REMEMBERED:
                self._crashes.popitem(last=False)
            log.warning("handling crashed, will retry", subject=delivery.subject, exc_info=True)
            with contextlib.suppress(BrokerError):
                await delivery.nak(RETRY_DELAY_S * crashes)
            return
        log.error("handling keeps crashing; dead-lettered as poison", subject=delivery.subject)
        message = f"handling failed {crashes} times: {type(exc).__name__}: {exc}"
        error = ErrorInfo(type="poison", message=message[:1000], retryable=False)
        await self._ended(delivery, "poison", error, task_of)

    async def _ended(
        self, delivery: Delivery, reason: str, error: ErrorInfo, task_of: TaskOf | None
    ) -> None:
        """End the message as ``reason``: its task's sender told, or dead-lettered as is."""
        try:
            if (task := _task_in(delivery, task_of)) is not None:
                await end_with_error(self._broker, task, reason, error)
            else:
                await dead_letter_delivery(
                    self._broker, delivery, reason=reason, error=error, topic=_topic_of(delivery)
                )
        except BrokerError as failed:
            await _later(
                delivery, RETRY_DELAY_S, f"{reason} not dead-lettered yet", error=str(failed)
            )
            return
        with contextlib.suppress(BrokerError):
            await delivery.ack()  # dealt with: it is in the dead-letter stream now


def _task_in(delivery: Delivery, task_of: TaskOf | None) -> Task | None:
    if task_of is None:
        return None
    try:
        return task_of(delivery)
    except Exception:  # the reading may be what crashes: the raw message is dead-lettered
        log.warning("no task read from a poison message", exc_info=True)
        return None


def _topic_of(delivery: Delivery) -> str:
    """A token for the dead letter's subject: ``_`` and the stream's name."""
    return f"_{delivery.stream.lower()}"


async def _later(delivery: Delivery, delay_s: float, why: str, **fields: object) -> None:
    log.warning(why, subject=delivery.subject, **fields)
    with contextlib.suppress(BrokerError):
        await delivery.nak(delay_s)
