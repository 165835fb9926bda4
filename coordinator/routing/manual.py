"""Manual-review queues: where a task goes when its intent is not sure enough (or a rule
sends it there), to wait for a person or a program that answers for one.

An item is a record in KV ``reach_manual`` under the task's message id, so every replica and
the ``reach manual`` command line share it, and each change (take, answer, send, expire) is a
compare-and-set that exactly one party wins. The caller hears at once that its task waits
for a person (an ``ack`` and a ``progress`` to its ``reply_to``), then gets the person's
answer as the task's ``result``. A person is slower than an agent, so an item waits
``manual.ttl_s`` (a day by default), not the task's own ttl (30 s by default); an item still
open then is dead-lettered as ``expired``. Every replica watches the bucket and tries to
expire what is due; the compare-and-set makes one of them do it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, BucketWatch, Change
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import about, emit, event_for, reply
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.envelopes import (
    Ack,
    DecodeError,
    ErrorInfo,
    ManualItem,
    Progress,
    Result,
    Task,
    decode_as,
    now_ms,
)

log = structlog.get_logger("coordinator.manual")

WEEK_S = 7 * 24 * 3600.0
IDLE_CHECK_S = 60.0  # with nothing due, look again at least this often (a missed change)


class ManualConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long a task waits in a manual-review queue for a person before it expires."""

    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=WEEK_S)] = 24 * 3600.0


class ManualQueue:
    """Puts tasks into manual-review queues and expires those nobody answered in time."""

    def __init__(self, broker: Broker, config: ManualConfig) -> None:
        self._broker = broker
        self.config = config
        self._deadlines: dict[str, int] = {}  # open items: message id -> deadline (ms)
        self._changed = asyncio.Event()

    async def enqueue(
        self, task: Task, *, queue: str, rule: str, reason: str, needed: float | None = None
    ) -> None:
        """Park ``task`` in ``queue`` for a person; tell its caller so. A task that was
        answered already (sent again with the same message id) gets its answer again."""
        bucket = await self._bucket()
        entered = now_ms()
        item = ManualItem(
            message_id=task.message_id,
            queue=queue,
            task=task,
            reason=reason,
            rule=rule,
            entered_ms=entered,
            deadline_ms=entered + int(self.config.ttl_s * 1000),
        )
        swap = await bucket.cas(task.message_id, lambda old: _parked(old, item))
        current = swap.entry.value if swap.entry else item
        if current.status == "answered":
            log.info("answered before; sending the answer again", queue=current.queue)
            await reply(self._broker, task, Result(**about(task, result=current.answer)))
            return
        detail: dict[str, object] = {"rule": rule, "manual": queue, "reason": reason}
        if task.resolution is not None:
            detail["resolution"] = msgspec.to_builtins(task.resolution)
            detail["needed"] = needed
        await emit(self._broker, event_for(task, "routed", **detail))
        await reply(self._broker, task, Ack(**about(task)))
        note = f"waiting for a person in manual-review queue {queue!r}: {reason}"
        await reply(self._broker, task, Progress(**about(task, note=note)))
        log.info("waiting for manual review", queue=queue, reason=reason)

    async def run(self, ready: asyncio.Event) -> None:
        """Follow the bucket and expire open items past their deadline, until cancelled."""
        bucket = await self._bucket()
        async with bucket.watch() as watch:
            waiter = asyncio.create_task(_signal(watch, ready))
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._expire_due(bucket))
                    async for change in watch:
                        honour_cancellation()
                        self._apply(change)
            finally:
                waiter.cancel()

    def _apply(self, change: Change) -> None:
        self._deadlines.pop(change.key, None)
        if change.value is not None:
            try:
                item = decode_as(change.value, ManualItem)
            except DecodeError as exc:
                log.warning("ignoring unreadable manual item", key=change.key, error=str(exc))
                return
            if item.open:
                self._deadlines[change.key] = item.deadline_ms
        self._changed.set()

    async def _expire_due(self, bucket: Bucket[ManualItem]) -> None:
        while True:
            self._changed.clear()  # before looking: a change from now on wakes the wait below
            now = now_ms()
            due = [key for key, deadline in self._deadlines.items() if deadline <= now]
            for key in due:
                self._deadlines.pop(key, None)
                await self._expire(bucket, key)
            wait_s = IDLE_CHECK_S
            if self._deadlines:
                wait_s = min(wait_s, max(0.0, (min(self._deadlines.values()) - now) / 1000))
            try:
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def _expire(self, bucket: Bucket[ManualItem], key: str) -> None:
        ended = now_ms()

        def expire(item: ManualItem | None) -> ManualItem | None:
            if item is None or not item.open or item.deadline_ms > ended:
                return None
            return msgspec.structs.replace(item, status="expired", ended_ms=ended)

        swap = await bucket.cas(key, expire)
        if not swap.written or swap.entry is None:
            return  # answered, sent or expired by someone else meanwhile
        item = swap.entry.value
        message = (
            f"no one answered in manual-review queue {item.queue!r}"
            f" within {self.config.ttl_s:g} s ({item.reason})"
        )
        error = ErrorInfo(type="expired", message=message, retryable=False)
        await end_with_error(self._broker, item.task, "expired", error)

    async def _bucket(self) -> Bucket[ManualItem]:
        return await self._broker.bucket(self._broker.names.manual_bucket, ManualItem)


def _parked(old: ManualItem | None, item: ManualItem) -> ManualItem | None:
    """The record to write for a task arriving in a queue: a new item, unless one is open or
    answered already (a redelivery, or the same message sent again)."""
    if old is not None and old.status in ("waiting", "taken", "answered"):
        return None
    return item


async def _signal(watch: BucketWatch, ready: asyncio.Event) -> None:
    await watch.initial.wait()
    ready.set()
