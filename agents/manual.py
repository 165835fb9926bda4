"""``ManualReview``: the people's side of manual-review queues — list, take, answer, send on,
reject.

    async with ReachClient(url) as client:
        review = ManualReview(client.broker, by="alice")
        for item in await review.items(queue="review"):
            await review.take(item.message_id)            # "I am on it": others are told so
            await review.answer(item.message_id, {"refunded": True})   # the caller's result

Each step is a compare-and-set on the item in KV ``reach_manual``, so of two people answering
the same task exactly one succeeds; the other is told who answered. A take lapses after
``take_s`` (a person who walked away does not block the item for ever). The coordinator
carries each step out at once: an answer goes to the task's ``reply_to`` as its ``result``
and into its trace as ``completed``; a task sent on is published on the topic the person
chose, as a new message in the same trace with the same ``reply_to``, so the caller gets that
agent's answer instead. People need no right to publish tasks, events or replies: only to
write this bucket.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

import msgspec

from agentreach.broker import Broker, Bucket
from agentreach.envelopes import (
    AgentCard,
    ManualItem,
    WorkflowRecord,
    is_token,
    new_id,
    now_ms,
)
from agentreach.envelopes.coordination import step_abandoned, workflow_step_of
from agentreach.errors import ReachError

TAKE_S = 15 * 60.0
MAX_TAKE_S = 7 * 24 * 3600.0  # an item waits at most a week (manual.ttl_s)
SHOWN_TOPICS = 20  # served topics named when a send is refused


class ManualReviewError(ReachError):
    """The item is not there, or not open, or someone else holds it; the message says which."""


class ManualReview:
    """Manual-review queues as seen by a person (``by``) or a program answering for one."""

    def __init__(self, broker: Broker, *, by: str | None = None) -> None:
        self._broker = broker
        self.by = by or _user()

    async def items(self, *, queue: str | None = None, closed: bool = False) -> list[ManualItem]:
        """The items waiting (or taken), oldest first; with ``closed`` the answered, sent,
        rejected and expired ones the bucket still keeps too."""
        found = await (await self._bucket()).snapshot()
        items = [entry.value for entry in found.values()]
        return sorted(
            (i for i in items if (closed or i.open) and queue in (None, i.queue)),
            key=lambda i: (i.entered_ms, i.message_id),
        )

    async def get(self, message_id: str) -> ManualItem:
        """One item, open or not."""
        entry = await (await self._bucket()).get(message_id)
        if entry is None:
            raise ManualReviewError(f"no manual-review item {message_id!r}")
        return entry.value

    async def take(self, message_id: str, *, take_s: float = TAKE_S) -> ManualItem:
        """Hold the item for ``take_s`` (again, if this person holds it already), at most
        until it expires."""
        if not 0 < take_s <= MAX_TAKE_S:
            raise ManualReviewError(
                f"a take holds for more than 0 and at most {MAX_TAKE_S:g} s; got {take_s:g}"
            )

        def take(item: ManualItem, now: int) -> ManualItem:
            until = min(now + int(take_s * 1000), item.deadline_ms)
            return msgspec.structs.replace(
                item, status="taken", taken_by=self.by, taken_until_ms=until
            )

        return await self._change(message_id, take)

    async def answer(self, message_id: str, result: Any) -> ManualItem:
        """Answer the task: the coordinator sends ``result`` to its caller as the task's
        ``result`` and records it as ``completed``."""

        def answer(item: ManualItem, now: int) -> ManualItem:
            return msgspec.structs.replace(
                item, status="answered", answer=result, ended_by=self.by, ended_ms=now
            )

        return await self._change(message_id, answer)

    async def send(self, message_id: str, topic: str, *, force: bool = False) -> ManualItem:
        """Send the task on to ``topic`` (the person's choice of intent): the coordinator
        publishes it as a new message (``sent_as``) in the same trace, answering the same
        ``reply_to``. Refused when no registered agent serves ``topic`` (a typo would close
        the item and dead-letter the task as ``no_route``), unless ``force`` (a routing rule
        or a workflow may take a topic no agent serves)."""
        if not is_token(topic):
            raise ManualReviewError(f"topic {topic!r}: use 1-128 letters, digits, '_' or '-'")
        if not force and topic not in (served := await self._served()):
            listed = ", ".join(sorted(served)[:SHOWN_TOPICS]) or "none"
            raise ManualReviewError(
                f"{message_id} not sent: no registered agent serves topic {topic!r}"
                f" (served: {listed}); send it with force (reach manual send --force) when a"
                " routing rule or a workflow takes it"
            )

        def send(item: ManualItem, now: int) -> ManualItem:
            return msgspec.structs.replace(
                item,
                status="sent",
                sent_to=topic,
                sent_as=new_id(),
                ended_by=self.by,
                ended_ms=now,
            )

        return await self._change(message_id, send)

    async def reject(self, message_id: str, why: str) -> ManualItem:
        """Refuse the task (out of scope, abusive, …): the coordinator dead-letters it as
        ``rejected`` with ``why``, where compensation workers see it, and sends its caller
        that error."""
        if not why.strip():
            raise ManualReviewError(f"{message_id} not rejected: say why (it goes to the caller)")

        def reject(item: ManualItem, now: int) -> ManualItem:
            return msgspec.structs.replace(
                item, status="rejected", rejected=why, ended_by=self.by, ended_ms=now
            )

        return await self._change(message_id, reject)

    async def _change(
        self, message_id: str, change: Callable[[ManualItem, int], ManualItem]
    ) -> ManualItem:
        """Apply ``change`` if the item is open and nobody else holds it; else say why not."""
        await self._refuse_if_abandoned(message_id)
        refused: list[str] = []

        def guarded(item: ManualItem | None) -> ManualItem | None:
            refused.clear()
            now = now_ms()
            if item is None:
                refused.append(f"no manual-review item {message_id!r}")
            elif not item.open:
                refused.append(_closed(item))
            elif (holder := item.holder(now)) and holder != self.by:
                left_s = (item.taken_until_ms - now) // 1000
                refused.append(f"{message_id} is taken by {holder} for {left_s} s more")
            else:
                return change(item, now)
            return None

        swap = await (await self._bucket()).cas(message_id, guarded)
        if not swap.written or swap.entry is None:
            raise ManualReviewError(refused[0] if refused else f"{message_id} did not change")
        return swap.entry.value

    async def _refuse_if_abandoned(self, message_id: str) -> None:
        """An open item whose task is a step of a workflow that no longer waits for it
        (cancelled, ended, the step stopped) is withdrawn now, and the person told so: an
        answer would reach nobody. (The coordinator withdraws such items itself, and checks
        again before it carries an answer out.)"""
        bucket = await self._bucket()
        entry = await bucket.get(message_id)
        if entry is None or not entry.value.open:
            return
        task = entry.value.task
        instance_id = self._broker.names.workflow_of(task.reply_to)
        step = workflow_step_of(instance_id, task)
        if instance_id is None or step is None:
            return
        flows = await self._broker.bucket(self._broker.names.workflows_bucket, WorkflowRecord)
        record = await flows.get(instance_id)
        why = step_abandoned(record.value if record else None, step, message_id)
        if why is not None:
            await bucket.cas(message_id, lambda old: old and old.withdraw(why, now_ms()))
            raise ManualReviewError(_withdrawn(message_id, why))

    async def _served(self) -> set[str]:
        """The intents on the cards of the registered agents."""
        cards = await self._broker.bucket(self._broker.names.agents_bucket, AgentCard)
        return {
            intent for entry in (await cards.snapshot()).values() for intent in entry.value.intents
        }

    async def _bucket(self) -> Bucket[ManualItem]:
        return await self._broker.bucket(self._broker.names.manual_bucket, ManualItem)


def _closed(item: ManualItem) -> str:
    match item.status:
        case "answered":
            return f"{item.message_id} was answered by {item.ended_by}"
        case "sent":
            return f"{item.message_id} was sent on to {item.sent_to!r} by {item.ended_by}"
        case "rejected":
            return f"{item.message_id} was rejected by {item.ended_by}: {item.rejected}"
        case "withdrawn":
            return _withdrawn(item.message_id, item.withdrawn)
        case _:
            return f"{item.message_id} expired: nobody answered it in time"


def _withdrawn(message_id: str, why: str) -> str:
    return f"{message_id} was withdrawn: its workflow no longer waits for an answer ({why})"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container): say so
        return "unknown"
