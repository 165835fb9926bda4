"""Watching a KV bucket as a plain async iterator of changes (no sentinel values).

The watch is an ordered push consumer on the bucket's stream, like nats-py's ``kv.watch()``,
but with an idle heartbeat of one second instead of five: the consumer lives on one server,
and when that server dies (or the stream's leader changes) nothing tells the client except
the missing heartbeats. nats-py makes the consumer again, from the next sequence, after two
missed heartbeats; with 5 s ones a watch fell 15-18 s behind after a kill -9, with 1 s ones
it resumes as soon as the new leader is elected.

nats-py makes that consumer again from the next sequence of the stream it watched; a stream
made again (a server back on an empty store, then provisioned again) starts over at 1, and
the watch would skip every change until the new stream passed the old one's last sequence
(a coordinator blind to the agents' cards and heartbeats for minutes). So the watch looks at
the stream's creation time every few seconds, and watches a stream made again from its
start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Self

import nats.aio.msg
from nats.js import api
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from agentreach.broker.errors import BrokerError, pause, translated
from agentreach.broker.initial_values import InitialValues
from agentreach.broker.messages import position_of
from agentreach.broker.record_seal import HEADERLESS_VALUE
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import server_answer
from agentreach.logs import RepeatedLines, get_logger

log = get_logger("broker.watch")

IDLE_HEARTBEAT_S = 1.0
REMADE_CHECK_S = 5.0  # how often a watch asks whether its stream was made again
INACTIVE_THRESHOLD_S = 300.0  # a watch whose process died is cleaned up by the server
KV_MARKER_REASON = "Nats-Marker-Reason"  # nats-server 2.11+: TTL and age expiry markers
_DELETED_BY_MARKER = {"MaxAge": KV_PURGE, "Purge": KV_PURGE, "Remove": KV_DEL}


@dataclass(frozen=True, slots=True)
class Change:
    """A key's new value, or ``value=None`` when it was deleted or purged."""

    key: str
    value: bytes | None
    revision: int
    written_ms: int = 0  # the broker's time of the write
    headers: Mapping[str, str] = field(default_factory=dict)  # those stored with the value


_INITIAL_DONE = object()  # in the queue only: the values present at the start are through
# What a watch takes instead of a value the server wrote over a key: the last one a writer
# of the bucket wrote before it, as a change (None: none the bucket keeps).
Recover = Callable[[Change], Awaitable["Change | None"]]
# Writes a key again (data, the revision it must still be at, PUT or DEL): Bucket._publish.
Repair = Callable[..., Awaitable[int]]
# Values not taken are said a few times a minute per watch, whatever their keys: anyone may
# aim copies at a bucket as fast as the server stores them, under keys of their choosing.
SAID_EVERY_S = 60.0
SAID_PER_INTERVAL = 5


class BucketWatch:
    """Every key's latest value, then each change as it happens. What the NATS server wrote
    over a key is no value (see :meth:`_taken`): ``recover`` gives the one before it.

    ``initial`` is set once the values present at the start were delivered.

        async with BucketWatch(kv) as watch:
            async for change in watch:
                ...
    """

    def __init__(
        self,
        kv: KeyValue,
        *,
        idle_heartbeat_s: float = IDLE_HEARTBEAT_S,
        remade_check_s: float | None = None,
        recover: Recover | None = None,
        headed: bool = False,
        repair: Repair | None = None,
    ) -> None:
        self._kv = kv
        self._recover = recover
        self._repair = repair
        self._good: dict[str, Change] = {}  # with repair: each key's last value taken
        self._headed = headed  # a value without headers is nobody's (bucket.RECORD_HEADERS)
        self._said = RepeatedLines(SAID_EVERY_S, burst=SAID_PER_INTERVAL)
        self._idle_heartbeat_s = idle_heartbeat_s
        self._remade_check_s = remade_check_s or REMADE_CHECK_S
        self._sub: nats.js.JetStreamContext.PushSubscription | None = None
        self._queue: asyncio.Queue[Change | object] = asyncio.Queue()
        self._initial = InitialValues(self._initial_through)
        self._created: object = None  # the watched stream's creation time
        self._guard: asyncio.Task[None] | None = None
        self.initial = asyncio.Event()
        self.remade = 0  # how often the stream was found made again (see the module's doc)

    async def __aenter__(self) -> Self:
        with translated(subject=f"{self._kv._pre}>"):
            self._created = (await self._kv._js.stream_info(self._kv._stream)).created
            self._sub = await self._subscribe()
            try:
                info = await self._sub.consumer_info()
            except BaseException:
                await self._stop()
                raise
        sent = info.delivered.consumer_seq if info.delivered is not None else 0
        self._initial.expect(sent=sent, pending=info.num_pending or 0)
        self._guard = asyncio.create_task(self._watch_the_stream(), name="watch-remade")
        return self

    async def _subscribe(self) -> nats.js.JetStreamContext.PushSubscription:
        kv = self._kv
        return await kv._js.subscribe(
            f"{kv._pre}>",
            stream=kv._stream,
            cb=self._on_message,
            ordered_consumer=True,
            idle_heartbeat=self._idle_heartbeat_s,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
            inactive_threshold=INACTIVE_THRESHOLD_S,
        )

    async def _watch_the_stream(self) -> None:
        """Watch the stream again from its start once it was made again."""
        while True:
            await pause(self._remade_check_s)
            try:
                with translated():
                    created = (await self._kv._js.stream_info(self._kv._stream)).created
                    if created == self._created or created is None:
                        continue
                    log.warning(
                        "a watched bucket's stream was made again; watching it from its start",
                        stream=self._kv._stream,
                    )
                    old, self._sub = self._sub, await self._subscribe()
                    self._created = created
                    self.remade += 1
            except BrokerError:
                continue  # not there yet (being made again), or the server away: look again
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.unsubscribe()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        self._initial.cancel()
        if self._guard is not None:
            await cancel_and_wait(self._guard)
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):  # closing: the subscription may be gone already
                await sub.unsubscribe()

    async def _on_message(self, msg: nats.aio.msg.Msg) -> None:
        at = position_of(msg)
        revision, written_ms, pending = at.stream_seq, at.timestamp_ns // 1_000_000, at.pending
        headers = msg.headers or {}
        operation = headers.get(KV_OP)
        if operation is None and KV_MARKER_REASON in headers:
            operation = _DELETED_BY_MARKER.get(headers[KV_MARKER_REASON])
            if operation is None:  # a marker of a kind not known yet: not a value
                self._initial.delivered(pending)
                return
        deleted = operation in (KV_DEL, KV_PURGE)
        self._queue.put_nowait(
            Change(
                key=msg.subject[len(self._kv._pre) :],
                value=None if deleted else msg.data,
                revision=revision,
                written_ms=written_ms,
                headers=headers,
            )
        )
        self._initial.delivered(pending)

    def _initial_through(self) -> None:
        self._queue.put_nowait(_INITIAL_DONE)

    def __aiter__(self) -> AsyncIterator[Change]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[Change]:
        assert self._sub is not None, "use `async with BucketWatch(...)`"
        while True:
            item = await self._queue.get()
            if item is _INITIAL_DONE:
                self.initial.set()
                continue
            assert isinstance(item, Change)
            if (taken := await self._taken(item)) is not None:
                yield taken

    async def _taken(self, change: Change) -> Change | None:
        """``change``, unless the NATS server wrote it (anyone may aim the answer to a request
        at a key through its reply subject, a direct get's answer with content of their
        choosing among them): then the last value a writer wrote before it, or nothing."""
        said = server_answer(change.value or b"", change.headers)
        if said is None and self._headed and not change.headers:
            said = HEADERLESS_VALUE
        if said is None:
            if self._repair is not None:  # what to write back when copies outnumber history
                self._good[change.key] = change
            return change
        recovered = await self._recover(change) if self._recover is not None else None
        if self._repair is not None:
            known = self._good.get(change.key)
            recovered = recovered or (known and replace(known, revision=change.revision))
            if recovered is not None:
                await _write_back(self._repair, recovered)
        self._say_not_taken(change, said, recovered is not None)
        return recovered

    def _say_not_taken(self, change: Change, said: str, recovered: bool) -> None:
        headerless = said is HEADERLESS_VALUE
        if (unsaid := self._said.due("headerless" if headerless else "answer")) is None:
            return
        log.warning(
            "a value without headers not taken (a secured deployment reads none)"
            if headerless
            else "the NATS server's answer to someone's request was written over a key: not"
            " taken for a value",
            stream=self._kv._stream,
            key=change.key,
            written=said,
            instead="the value before it" if recovered else "none (the last one stands)",
            **({"more_not_said": unsaid} if unsaid else {}),
        )

    async def snapshot(self) -> list[Change]:
        """The values present when the watch began (deleted keys left out), then stop."""
        assert self._sub is not None, "use `async with BucketWatch(...)`"
        found: dict[str, Change] = {}
        while (item := await self._queue.get()) is not _INITIAL_DONE:
            assert isinstance(item, Change)
            if (item := await self._taken(item)) is None:
                continue
            if item.value is None:
                found.pop(item.key, None)
            else:
                found[item.key] = item
        self.initial.set()
        return list(found.values())


async def snapshot(kv: KeyValue) -> list[Change]:
    """Every key's current value, read through one watch rather than a request per key.

    Raises only :class:`~agentreach.broker.errors.BrokerError`.
    """
    async with BucketWatch(kv) as watch:
        with translated():
            return await watch.snapshot()


async def _write_back(repair: Repair, recovered: Change) -> None:
    """Write ``recovered`` over the copy at its revision: enough copies pushed the real
    value out of the key's history (5 revisions kept), and a replica that started later
    found none (an agent's allowance, a waiting review: a security re-test)."""
    operation = "PUT" if recovered.value is not None else "DEL"
    try:
        data, last = recovered.value or b"", recovered.revision
        await repair(recovered.key, data, last=last, operation=operation)
    except BrokerError as exc:  # written since (another replica's repair), or no room
        log.debug("a copied value not written over", key=recovered.key, error=str(exc))
