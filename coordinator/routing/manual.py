"""Manual-review queues: where a task goes when its intent is not sure enough (or a rule
sends it there), to wait for a person or a program that answers for one (or rejects it).

An item is a record in KV ``reach_manual`` under the task's message id, so every replica and
the ``reach manual`` command line share it, and each change a person makes (take, answer,
send) is a compare-and-set that exactly one party wins. People only change the record; the
coordinator carries the change out, under a lease so that one replica does it: it announces a
take, sends an answer to the caller as the task's ``result`` (recorded as ``completed``),
publishes a task sent on, dead-letters a rejected one as ``rejected`` (the person's reason
to the caller), and expires what waited too long. So a person needs no right to
publish as the coordinator, and the trace holds only what the coordinator recorded. A task
that is a workflow step is withdrawn once its workflow no longer waits for it (the engine
withdraws it as it lets the step go; an answer that comes anyway is not carried out).

The caller hears at once that its task waits for a person (an ``ack`` and a ``progress``). A
person is slower than an agent, so an item waits ``manual.ttl_s`` (a day by default), not the
task's own ttl (30 s by default); one still open then is dead-lettered as ``expired``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, Bucket, Change, SubjectFull
from agentreach.broker.backpressure import publish_when_room
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import about, emit, event_for, reply
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.routing.abandoned import abandoned
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
from agentreach.envelopes import headers as h

log = structlog.get_logger("coordinator.manual")

WEEK_S = 7 * 24 * 3600.0
IDLE_CHECK_S = 60.0  # with nothing due, look again at least this often
STEP_GRACE_MS = 5_000  # past a workflow step's own timeout, as the saga waits for a step


class ManualConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long a task waits in a manual-review queue for a person before it expires."""

    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=WEEK_S)] = 24 * 3600.0


class ManualQueue:
    """Puts tasks into manual-review queues (any replica); carries out what people decided
    and expires what nobody answered (``run``, on the replica holding the lease)."""

    def __init__(self, broker: Broker, config: ManualConfig) -> None:
        self._broker = broker
        self.config = config
        self._deadlines: dict[str, int] = {}  # open items: message id -> deadline (ms)
        self._announced: set[tuple[str, str]] = set()  # takes said in an event
        self._changed = asyncio.Event()

    async def enqueue(
        self, task: Task, *, queue: str, rule: str, reason: str, needed: float | None = None
    ) -> None:
        """Park ``task`` in ``queue`` for a person; tell its caller so. A task that was
        answered already (sent again with the same message id) gets its answer again."""
        entered = now_ms()
        deadline = entered + int(self.config.ttl_s * 1000)
        if self._broker.names.workflow_of(task.reply_to) is not None:
            # A workflow's step is given up by its workflow at its own timeout (the item is
            # withdrawn then): shown with that deadline, a moment after it so that the
            # workflow's timer, not this queue's expiry, is what ends it.
            deadline = min(deadline, entered + task.ttl_ms + STEP_GRACE_MS)
        item = ManualItem(
            message_id=task.message_id,
            queue=queue,
            task=task,
            reason=reason,
            rule=rule,
            entered_ms=entered,
            deadline_ms=deadline,
        )
        swap = await (await self._bucket()).cas(task.message_id, lambda old: _parked(old, item))
        current = swap.entry.value if swap.entry else item
        if current.task.caller != task.caller:
            await _refuse_as_taken(self._broker, task, current)
            return
        if current.status == "answered":
            log.info("answered before; sending the answer again", queue=current.queue)
            await reply(self._broker, task, Result(**about(task, result=current.answer)))
            return
        # Asked once the item exists: a workflow that ends after this read withdraws it.
        if (why := await abandoned(self._broker, task)) is not None:
            await withdraw(self._broker, task.message_id, why)
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

    async def run(self) -> None:
        """Follow the bucket until cancelled: carry out takes, answers and sends, expire open
        items past their deadline. Run by one replica at a time (a lease); after a restart
        the watch gives every item again, and what was not carried out yet is done then."""
        bucket = await self._bucket()
        self._deadlines.clear()
        self._announced.clear()
        async with bucket.watch(repair=True) as watch, asyncio.TaskGroup() as group:
            group.create_task(self._expire_due(bucket))
            async for change in watch:
                honour_cancellation()
                if (item := self._apply(change)) is not None:
                    await self._carry_out(bucket, item)

    def _apply(self, change: Change) -> ManualItem | None:
        self._deadlines.pop(change.key, None)
        self._changed.set()
        if change.value is None:
            return None
        try:
            item = decode_as(change.value, ManualItem)
        except DecodeError as exc:
            log.warning("ignoring unreadable manual item", key=change.key, error=str(exc))
            return None
        if item.open:
            self._deadlines[change.key] = item.deadline_ms
        return item

    async def _carry_out(self, bucket: Bucket[ManualItem], item: ManualItem) -> None:
        task = item.task
        if item.status == "taken" and (item.message_id, item.taken_by) not in self._announced:
            self._announced.add((item.message_id, item.taken_by))
            taken = event_for(task, "manual_taken", by=item.taken_by, queue=item.queue)
            await emit(self._broker, taken)
        if item.delivered_ms or item.status not in ("answered", "sent", "rejected", "withdrawn"):
            return
        if item.status != "withdrawn" and (why := await abandoned(self._broker, task)):
            # Answered (or sent on) for a workflow that no longer waits: not carried out.
            swap = await bucket.cas(
                item.message_id, lambda old: old and old.withdraw(why, now_ms())
            )
            if not swap.written or swap.entry is None:
                return  # changed meanwhile: the watch gives the change
            item = swap.entry.value
        match item.status:
            case "answered":
                await self._answer(item)
            case "sent":
                await self._send(item)
            case "rejected":
                await self._reject(item)
            case _:
                await self._withdrawn(item)
        # Marked after the deed: a crash in between does it again (its event is deduplicated;
        # the caller may see the answer twice, never not at all).
        await bucket.cas(item.message_id, _delivered)

    async def _answer(self, item: ManualItem) -> None:
        task = item.task
        completed = event_for(
            task,
            "completed",
            result=item.answer,
            duration_ms=item.ended_ms - item.entered_ms,
            answered_by=item.ended_by,
            queue=item.queue,
        )
        await emit(self._broker, completed)
        await reply(self._broker, task, Result(**about(task, result=item.answer)))
        log.info("answered by a person", message_id=task.message_id, by=item.ended_by)

    async def _reject(self, item: ManualItem) -> None:
        by, queue = item.ended_by, item.queue
        await emit(self._broker, event_for(item.task, "manual_rejected", by=by, queue=queue))
        message = f"rejected by {by} in manual-review queue {queue!r}: {item.rejected}"
        error = ErrorInfo(type="rejected", message=message, retryable=False)
        await end_with_error(self._broker, item.task, "rejected", error, started=False)

    async def _withdrawn(self, item: ManualItem) -> None:
        """Say in the trace that the item was withdrawn (and whose answer was not sent)."""
        detail: dict[str, object] = {"queue": item.queue, "why": item.withdrawn}
        if item.ended_by:
            detail["not_sent_for"] = item.ended_by
        await emit(self._broker, event_for(item.task, "manual_withdrawn", **detail))
        log.info("withdrawn from manual review", message_id=item.message_id, why=item.withdrawn)

    async def _send(self, item: ManualItem) -> None:
        original = item.task
        task = msgspec.structs.replace(
            original,
            message_id=item.sent_as,
            topic=item.sent_to,
            attempt=1,
            to_agent=None,
            ttl_ms=envelopes.DEFAULT_TTL_MS,
            resolution=None,
            created_at=now_ms(),
        )
        sent = event_for(
            original, "manual_sent", by=item.ended_by, topic=task.topic, sent_as=task.message_id
        )
        await emit(self._broker, sent)
        subject = self._broker.names.coordinator_task(task.topic)
        try:  # waits for room: other items wait meanwhile, at most the task's ttl
            await publish_when_room(
                self._broker,
                subject,
                envelopes.encode(task),
                headers=h.task_headers(task),
                within_s=task.ttl_ms / 1000,
            )
        except SubjectFull as exc:
            message = (
                f"not sent on to {task.topic!r}: for its whole ttl of {task.ttl_ms} ms the"
                f" intake held as many tasks on {subject!r} as it keeps"
                f" (limits.tasks_per_subject): {exc}"
            )
            log.error("a task sent on by a person was refused", error=message)
            error = ErrorInfo(type="backlog_full", message=message, retryable=True)
            await end_with_error(self._broker, task, "rejected", error, started=False)
            return
        log.info("sent on by a person", message_id=original.message_id, to=task.topic)

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
            return  # answered or sent meanwhile
        item = swap.entry.value
        message = (
            f"no one answered in manual-review queue {item.queue!r}"
            f" within {self.config.ttl_s:g} s ({item.reason})"
        )
        error = ErrorInfo(type="expired", message=message, retryable=False)
        await end_with_error(self._broker, item.task, "expired", error, started=False)

    async def _bucket(self) -> Bucket[ManualItem]:
        return await self._broker.bucket(self._broker.names.manual_bucket, ManualItem)


async def withdraw(broker: Broker, message_id: str, why: str) -> bool:
    """Withdraw the manual-review item of ``message_id``, a workflow step's task that its
    workflow no longer waits for (``why``); False when there is none to withdraw."""
    bucket = await broker.bucket(broker.names.manual_bucket, ManualItem)
    swap = await bucket.cas(message_id, lambda old: old and old.withdraw(why, now_ms()))
    return swap.written


async def _refuse_as_taken(broker: Broker, task: Task, held: ManualItem) -> None:
    """Items are kept by message id: one of another caller's under this id is theirs, its
    answer too (an agent had alice's answer sent to it by sending its own task under her
    id; or parked its own first, and the person's answer to alice went to it)."""
    message = (
        f"message id {task.message_id!r} is {held.status} in manual review for another"
        " caller's message: send it under an id of your own"
    )
    error = ErrorInfo(type="duplicate_id", message=message, retryable=False)
    await end_with_error(broker, task, "rejected", error, started=False)


def _parked(old: ManualItem | None, item: ManualItem) -> ManualItem | None:
    """The record to write for a task arriving in a queue: a new item, unless one is open or
    answered already (a redelivery, or the same message sent again)."""
    if old is not None and old.status in ("waiting", "taken", "answered"):
        return None
    return item


def _delivered(item: ManualItem | None) -> ManualItem | None:
    if item is None or item.delivered_ms:
        return None
    return msgspec.structs.replace(item, delivered_ms=now_ms())
