"""A KV bucket of typed records, with one compare-and-set for every conditional change.

    agents = await broker.bucket(names.agents_bucket, AgentCard)
    card = await agents.get("worker-1")           # Entry[AgentCard] | None
    swap = await agents.cas("worker-1", bump_epoch)
    if swap.written: ...

:meth:`Bucket.cas` reads the key, asks ``change`` for its new value, and writes it
only if nobody wrote in between (the revision it read is the condition); a lost
race reads again and asks again. ``change`` returns None to leave the key as it is.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from agentreach.broker.auth import PARTIES
from agentreach.broker.direct import LastValues, last_of_each, last_per_subject
from agentreach.broker.errors import Contended, StreamNotFound, WrongLastSequence, translate
from agentreach.broker.failover import stream_names
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.record_seal import (
    HEADERLESS_VALUE,
    KV_OPERATION,
    RECORD_HEADERS,
    RecordSeal,
)
from agentreach.broker.streams import StoredMessage, last_message, leader_message
from agentreach.broker.watch import BucketWatch, Change
from agentreach.envelopes import DecodeError, decode_as, encode, server_answer
from agentreach.logs import RepeatedLines, get_logger

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

log = get_logger("broker.bucket")

T = TypeVar("T")
EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
CAS_TRIES = 20
CAS_PAUSE_S, CAS_PAUSE_CAP_S = 0.001, 0.05  # after a lost race: up to 2, 4, … ms, 50 ms at most
LOOK_BACK = 8  # earlier revisions read past unreadable ones (KV history keeps at most 64)
UNREAD = object()  # cas(known=UNREAD): read the key first (the default)
# Reads past a copy said a few times a minute per bucket (a heartbeat is read often).
_READ_PAST = RepeatedLines(60.0, burst=5)


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """A key's value and the revision it was read or written at."""

    key: str
    value: T
    revision: int
    written_ms: int = 0  # the broker's time of the write; 0 where the read does not say


@dataclass(frozen=True, slots=True)
class Swap(Generic[T]):
    """What :meth:`Bucket.cas` did: ``written`` tells whether ``change`` wrote; ``entry`` is
    the key now (the value written, or the one ``change`` declined to replace)."""

    written: bool
    entry: Entry[T] | None


async def bound_kv(broker: Broker, bucket: str) -> KeyValue:
    """The provisioned KV bucket ``bucket``, bound without reading its stream's info.

    Stream info lists every key (``subjects_filter``), so it is not granted to agents or
    workers; whether the bucket exists is asked from the stream names (any party may). The
    buckets are provisioned with direct gets: a read of a key is a direct get of its subject.
    """
    stream = f"KV_{bucket}"
    try:
        found = await stream_names(broker, subject=f"$KV.{bucket}.>")
    except nats.errors.Error as exc:
        raise translate(exc, subject=bucket) from exc
    if stream not in found:
        raise StreamNotFound(
            f"KV bucket {bucket} does not exist: run `reach provision`"
            " (or start the coordinator, which provisions)",
            err_code=10059,
        )
    return KeyValue(name=bucket, stream=stream, pre=f"$KV.{bucket}.", js=broker.js, direct=True)


class Bucket(Generic[T]):
    """Typed access to one KV bucket; values are JSON-encoded records of ``kind``."""

    def __init__(
        self,
        broker: Broker,
        kv: KeyValue,
        kind: type[T],
        name: str,
        *,
        seal: RecordSeal | None,
        headed: bool = False,
    ) -> None:
        self._broker = broker
        self._kv = kv
        self._kind = kind
        self._seal = seal
        self._headed = headed  # a value without headers is nobody's (record_seal.RECORD_HEADERS)
        self.name = name

    async def get(self, key: str, *, leader: bool = False) -> Entry[T] | None:
        """The key's value, or None when it is absent or deleted; raises DecodeError when
        the stored value is not a ``kind`` (or, sealed, not as a replica wrote it) and no
        earlier revision the bucket keeps is (see :meth:`_written_before`). ``leader``: as
        the stream's leader has it, not as the nearest replica (which may be behind)."""
        stored = await self._read(key, leader=leader)
        if stored is None:
            return None
        try:
            value = self._value(key, stored)
        except DecodeError:
            found, value = await self._written_before(key, stored.stream_seq)
            if not found:
                raise
        return None if value is None else Entry(key, value, stored.stream_seq)

    # Writes go through Broker.publish (one ack subscription, no timer per write), and ride
    # out a leader election of the bucket's stream (see broker.failover): one that found no
    # leader was not stored, so it is made again. One that timed out is not: it may have
    # been stored, and a conditional write made again would then lose to itself.
    async def create(self, key: str, value: T) -> int:
        """Write ``value`` if the key is absent (or deleted); raises WrongLastSequence if not."""
        data = encode(value)
        try:
            return await self._publish(key, data, last=0)
        except WrongLastSequence:
            deleted_at = await self.deleted_at(key)  # a delete marker is a revision too
            if not deleted_at:
                raise
            return await self._publish(key, data, last=deleted_at)

    async def update(self, key: str, value: T, *, last: int) -> int:
        """Write ``value`` if the key is still at revision ``last``; raises WrongLastSequence."""
        return await self._publish(key, encode(value), last=last)

    async def put(self, key: str, value: T) -> int:
        """Write ``value`` whatever the key holds."""
        return await self._publish(key, encode(value))

    async def _publish(
        self, key: str, data: bytes, *, last: int | None = None, operation: str = "PUT"
    ) -> int:
        subject = f"{self._kv._pre}{key}"
        headers = self._headers(subject, data, operation)
        if last is not None:
            headers[EXPECTED_LAST] = str(last)
        ack = await self._broker.publish(subject, data, headers=headers or None)
        return ack.seq

    def _headers(self, subject: str, data: bytes, operation: str) -> dict[str, str]:
        if self._seal is not None:
            return self._seal.headers(subject, data, operation)
        return dict(RECORD_HEADERS) if operation == "PUT" else {KV_OPERATION: operation}

    async def deleted_at(self, key: str) -> int:
        """The revision of the key's delete marker, or 0 when the key holds nothing."""
        stored = await self._read(key)
        return stored.stream_seq if stored is not None and _deleted(stored) else 0

    def put_message(self, key: str, value: T) -> Outgoing:
        """What :meth:`put` writes, as a message for :meth:`Broker.publish_all`."""
        subject, data = f"{self._kv._pre}{key}", encode(value)
        return Outgoing(subject, data, self._headers(subject, data, "PUT") or None)

    async def delete(self, key: str, *, last: int | None = None) -> None:
        """Delete the key (only if still at revision ``last``, when given)."""
        await self._publish(key, b"", last=last or None, operation="DEL")

    async def cas(
        self,
        key: str,
        change: Callable[[T | None], T | None],
        *,
        tries: int = CAS_TRIES,
        known: Entry[T] | object | None = UNREAD,
        unreadable: Callable[[], T | None] | None = None,
        confirm: bool = False,
    ) -> Swap[T]:
        """Replace the key's value with ``change(current)`` unless someone wrote meanwhile.

        ``current`` is None when the key is absent, and when it holds something unreadable
        (which the new value then replaces) unless ``unreadable`` says what to take instead:
        anyone may have had the server write its answer to a request onto a key. ``known`` is
        a value already read (or None for "absent"), used for the first try instead of a
        read. ``confirm``: "nothing to change" is decided on the value the stream's leader
        has, not on one a replica behind answered (a change then lost). A lost race waits a
        random moment, growing, before it reads again: a clustered server refuses a
        conditional write while another to the key is being applied, and two coordinator
        replicas sharing a quota lost 20 races in a row. ``tries`` lost races: Contended."""
        lost = 0
        for _ in range(tries):
            if known is not UNREAD:
                current, known = (known if isinstance(known, Entry) else None), UNREAD
            else:
                current = await self.last(key)  # not the leader's: agents may not ask it
            held = current.value if current else None
            if current is not None and held is None and unreadable is not None:
                held = unreadable()
            new = change(held)
            if new is None and confirm:
                confirm, leaders = False, await self.last(key, leader=True)
                if _revision(leaders) != _revision(current):
                    known = leaders  # a replica behind (or an old copy) answered: decide again
                    continue
            if new is None:
                return Swap(False, current)
            try:
                if current is None or current.revision == 0:
                    revision = await self.create(key, new)
                else:
                    revision = await self.update(key, new, last=current.revision)
            except WrongLastSequence:  # someone wrote first (or writes now): decide again
                lost += 1
                await asyncio.sleep(random.uniform(0, min(CAS_PAUSE_CAP_S, CAS_PAUSE_S * 2**lost)))
                continue
            return Swap(True, Entry(key, new, revision))
        raise Contended(f"{self.name}/{key} changed under us {tries} times in a row")

    def watch(self, *, repair: bool = False) -> BucketWatch:
        """Every key's latest value, then each change (raw bytes; see :class:`BucketWatch`).
        ``repair``: what the server wrote over a key is written over with the value before."""
        write = self._publish if repair else None
        return BucketWatch(self._kv, recover=self._recovered, headed=self._headed, repair=write)

    async def matching(self, pattern: str) -> dict[str, Entry[T]]:
        """The current values of the keys matching ``pattern`` (``a.*``); deleted keys and
        unreadable values are left out. Read together with the other reads asked for in the
        same turn of the event loop (:class:`~agentreach.broker.direct.LastValues`).

        The last message of each matching key, not every message from the first: the server
        finds those from its index, while a scan costs the whole bucket (8 ms a read at
        40,000 keys, and growing).
        """
        prefix = f"$KV.{self.name}."
        reads = self._broker.shared(LastValues)
        stored = await reads.read(f"KV_{self.name}", prefix + pattern)
        return await self._entries(stored, prefix)

    async def current(self, keys: list[str]) -> dict[str, Entry[T]]:
        """The current values of ``keys``, in batched reads; absent, deleted and unreadable
        ones are left out."""
        prefix = f"$KV.{self.name}."
        stored = await last_of_each(self._broker, f"KV_{self.name}", [prefix + k for k in keys])
        return await self._entries(stored, prefix)

    async def snapshot(self) -> dict[str, Entry[T]]:
        """Every key's current value, in one batched read (no consumer); deleted keys and
        unreadable values are left out."""
        prefix = f"$KV.{self.name}."
        stored = await last_per_subject(self._broker, f"KV_{self.name}", f"{prefix}>")
        return await self._entries(stored, prefix)

    async def _entries(self, messages: Iterable[StoredMessage], prefix: str) -> dict[str, Entry[T]]:
        found: dict[str, Entry[T]] = {}
        for stored in messages:
            key = stored.subject.removeprefix(prefix)
            try:
                value = self._value(key, stored)
            except DecodeError as exc:  # rare: read on, one key at a time
                recovered, value = await self._written_before(key, stored.stream_seq)
                if not recovered:
                    log.warning("unreadable record left out", bucket=self.name, error=str(exc))
                    continue
            if value is not None:
                found[key] = Entry(key, value, stored.stream_seq, stored.timestamp_ms)
        return found

    async def _read(self, key: str, *, leader: bool = False) -> StoredMessage | None:
        """The key's last message (a delete marker too), or None when there is none."""
        if not _VALID_KEY.fullmatch(key) or key.startswith(".") or key.endswith("."):
            raise translate(nats.js.errors.InvalidKeyError(), subject=f"{self.name}/{key}")
        subject = f"{self._kv._pre}{key}"
        read = leader_message if leader else last_message
        stored = await read(self._broker, self._kv._stream, subject)
        return stored if stored is not None and stored.subject == subject else None

    def _not_written(self, stored: StoredMessage) -> str | None:
        """What ``stored`` is when no writer of the bucket wrote it: the server's answer to
        a request someone aimed at the key or, sealed, anything without a replica's seal."""
        if said := server_answer(stored.data, stored.headers):
            return said
        if self._seal is not None:
            return (
                None if self._seal.holds(stored.subject, stored.data, stored.headers) else _UNSEALED
            )
        return HEADERLESS_VALUE if self._headed and not stored.headers else None

    def _value(self, key: str, stored: StoredMessage) -> T | None:
        """``stored``'s record, None for a delete marker; raises DecodeError naming what it
        holds when no writer of the bucket wrote it, or it is no ``kind``."""
        if why := self._not_written(stored):
            raise DecodeError(f"{self.name}/{key} (revision {stored.stream_seq}) holds {why}")
        if _deleted(stored):
            return None
        try:
            return decode_as(stored.data, self._kind)
        except DecodeError as exc:
            raise DecodeError(
                f"{self.name}/{key} (revision {stored.stream_seq}) holds something else, not a"
                f" {self._kind.__name__}: {exc}"
            ) from exc

    async def _written_before(self, key: str, revision: int) -> tuple[bool, T | None]:
        """Whether a revision of the key before ``revision`` is one its writers wrote, as far
        as the bucket's history keeps them, and its record (None: deleted). Anyone may have
        the server write its answer to a request onto a key: the record before it stands."""
        async for stored in self._earlier(key, revision):
            try:
                value = self._value(key, stored)
            except DecodeError:
                continue
            if (unsaid := _READ_PAST.due(self.name)) is not None:
                line = "read past a record none of the bucket's writers wrote"
                log.warning(line, bucket=self.name, key=key, revision=stored.stream_seq,
                            more_not_said=unsaid)  # fmt: skip
            return True, value
        return False, None

    async def _recovered(self, change: Change) -> Change | None:
        """For a watch: the last change a writer of the bucket made before ``change``, which
        the server wrote (see :meth:`BucketWatch._taken`), at its revision; None if none."""
        async for stored in self._earlier(change.key, change.revision):
            if self._not_written(stored) is None:
                value = None if _deleted(stored) else stored.data
                return Change(change.key, value, change.revision, stored.timestamp_ms,
                              stored.headers)  # fmt: skip
        return None

    async def _earlier(self, key: str, revision: int) -> AsyncIterator[StoredMessage]:
        """The key's revisions before ``revision`` the bucket keeps, newest first (a few).
        None for an agent, a caller or a worker: a secured deployment grants them direct gets
        of their own keys' last values only, and a denied read waited out its timeout (a
        heartbeat overwritten by anyone's server answer kept the agent from beating)."""
        if self._broker.auth.role in PARTIES:
            return
        subject = f"{self._kv._pre}{key}"
        for _ in range(LOOK_BACK):
            if revision <= 1:
                return
            earlier = await last_of_each(
                self._broker, self._kv._stream, [subject], up_to_seq=revision - 1
            )
            if not earlier:
                return
            revision = earlier[0].stream_seq
            yield earlier[0]

    async def last(self, key: str, *, after: int = 0, leader: bool = False) -> Entry[T] | None:
        """For a conditional write (cas, say): the key's entry; an unreadable value (and none
        readable before it) as ``None`` at its revision. None when absent or deleted.
        ``after``: a revision a refused write proved the key is past; a direct get answered
        by a replica behind it (a cluster catching up after a lost majority) is read again,
        a moment at most. ``leader``: as the stream's leader has it."""
        stored = await self._read(key, leader=leader)
        for _ in range(STALE_READS if after else 0):
            if stored is not None and stored.stream_seq > after:
                break
            await asyncio.sleep(STALE_PAUSE_S)  # nothing to await: a replica catches up
            stored = await self._read(key)
        if stored is None:
            return None
        try:
            value = self._value(key, stored)
        except DecodeError as exc:
            found, value = await self._written_before(key, stored.stream_seq)
            if not found:
                log.warning("replacing an unreadable record", bucket=self.name, error=str(exc))
            if value is None:  # unreadable throughout, or deleted before: at this revision
                return Entry(key, None, stored.stream_seq)  # type: ignore[arg-type]
        return None if value is None else Entry(key, value, stored.stream_seq)


STALE_READS = 10  # reads of a key a replica answers from behind a refused write, at most
STALE_PAUSE_S = 0.1
_VALID_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")  # as nats-py's: no wildcards, no spaces
_UNSEALED = "a record without the seal of the coordinator replicas that write it"


def _revision(entry: Entry[Any] | None) -> int:
    return entry.revision if entry is not None else 0


def _deleted(stored: StoredMessage) -> bool:
    return stored.headers.get(KV_OPERATION) in ("DEL", "PURGE")
