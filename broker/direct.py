"""Reading stored messages with batched direct gets: one request answers many messages, and
no consumer is made (a burst of readers must never approach the server's consumer limit).

``$JS.API.DIRECT.GET.<stream>`` with ``{"batch": N, "next_by_subj": S, "seq": Q}`` answers
every message on S (wildcards allowed) from sequence Q, up to N, then an end-of-batch status;
``{"multi_last": [S], "batch": N}`` answers the last message of each subject matching S
(``up_to_seq`` sets the moment). Streams and KV buckets are provisioned with direct gets
allowed. ``$JS.API.STREAM.INFO.<stream>`` with ``{"subjects_filter": S}`` counts the messages
on each subject matching S, from the same index.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import TYPE_CHECKING, Any

import msgspec
import nats.aio.msg
import nats.js.errors

from agentreach.broker.errors import (
    STREAM_NOT_FOUND,
    BrokerError,
    BrokerTimeout,
    StreamNotFound,
    translated,
)
from agentreach.broker.reply_inbox import ReplyInbox
from agentreach.broker.streams import DIRECT_GET_HEADERS, StoredMessage
from agentreach.broker.tasks import cancel_and_wait

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

BATCH = 1000
_END = {"204", "404"}  # end of batch; nothing (more) found
_TOO_MANY = "413"


async def messages_on(
    broker: Broker, stream: str, subject: str, *, from_seq: int = 1, limit: int = 100_000
) -> list[StoredMessage]:
    """Every message of ``stream`` on ``subject`` from ``from_seq``, oldest first (≤ limit).

    The server finds the first message from its subject index, unless the subject's
    wildcards leave few tokens literal (``a.*.*.*.id.*``): then it looks at every message of
    the stream, and a read costs more the longer the stream (20 ms at 180,000 messages).
    """
    found: list[StoredMessage] = []
    while len(found) < limit:
        size = min(BATCH, limit - len(found))
        request = {"batch": size, "next_by_subj": subject, "seq": from_seq}
        page, pending = await _batch(broker, stream, request)
        found += page
        if not page or pending == 0:
            break
        from_seq = page[-1].stream_seq + 1
    return found


async def last_per_subject(broker: Broker, stream: str, subject: str) -> list[StoredMessage]:
    """The last message of each subject matching ``subject`` (a KV bucket's current values)."""
    try:
        page, _ = await _batch(broker, stream, {"multi_last": [subject], "batch": BATCH * 10})
    except _TooMany:
        pass  # more subjects than one answer may hold: read them all, keep the last of each
    else:
        return page
    latest: dict[str, StoredMessage] = {}
    for message in await messages_on(broker, stream, subject, limit=10_000_000):
        latest[message.subject] = message
    return sorted(latest.values(), key=lambda m: m.stream_seq)


class LastValues:
    """The last-per-subject reads asked for in one turn of the event loop, sent together:
    one ``multi_last`` request per stream for up to ``CHUNK`` subjects (wildcards allowed).

    An intake batch's tasks each read their run-once records in the same turn; together
    they cost one round trip and one end-of-batch message instead of one each. A caller
    alone waits one turn of the loop more. Each caller gets the messages its subject
    matches; a read the server refuses as too large is made again for each subject alone.
    """

    CHUNK = 256

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._asked: dict[str, dict[str, _Askers]] = {}
        self._reading: set[asyncio.Task[None]] = set()

    async def read(self, stream: str, subject: str) -> list[StoredMessage]:
        """The last message of each subject of ``stream`` matching ``subject``."""
        loop = asyncio.get_running_loop()
        asked = self._asked.get(stream)
        if asked is None:
            asked = self._asked[stream] = {}
            loop.call_soon(self._send, stream)
        # A future of the caller's own: one that gives up cancels no other's answer.
        future: asyncio.Future[list[StoredMessage]] = loop.create_future()
        asked.setdefault(subject, []).append(future)
        return list(await future)

    async def close(self) -> None:
        await cancel_and_wait(*self._reading)

    def _send(self, stream: str) -> None:
        asked = list(self._asked.pop(stream).items())
        for at in range(0, len(asked), self.CHUNK):
            self._start(stream, dict(asked[at : at + self.CHUNK]))

    def _start(self, stream: str, asked: dict[str, _Askers]) -> None:
        reading = asyncio.create_task(self._answer(stream, asked))
        self._reading.add(reading)
        reading.add_done_callback(self._reading.discard)

    async def _answer(self, stream: str, asked: dict[str, _Askers]) -> None:
        try:
            if len(asked) == 1:
                ((subject, askers),) = asked.items()
                _settle(askers, await last_per_subject(self._broker, stream, subject))
                return
            request = {"multi_last": list(asked), "batch": BATCH * 10}
            page, pending = await _batch(self._broker, stream, request)
        except _TooMany:
            page, pending = [], 1
        except asyncio.CancelledError:  # closing: the readers get a broker error, not cancelled
            for askers in asked.values():
                _fail(askers, BrokerError(f"the connection closed while reading {stream}"))
            raise
        except Exception as exc:
            for askers in asked.values():
                _fail(askers, exc)
            return
        if pending:  # more than one answer holds: each subject on its own
            for subject, askers in asked.items():
                self._start(stream, {subject: askers})
            return
        for subject, askers in asked.items():
            _settle(askers, [m for m in page if subject_matches(subject, m.subject)])


_Askers = list[asyncio.Future[list[StoredMessage]]]  # the callers of one read, each waiting


def _settle(askers: _Askers, found: list[StoredMessage]) -> None:
    for future in askers:
        if not future.done():  # else: that caller gave up
            future.set_result(found)


def _fail(askers: _Askers, exc: Exception) -> None:
    for future in askers:
        if not future.done():
            future.set_exception(exc)


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` is one of ``pattern``'s (``*`` one token, ``>`` the rest)."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for at, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > at
        if at >= len(tokens) or (token != "*" and token != tokens[at]):
            return False
    return len(tokens) == len(wanted)


async def last_of_each(
    broker: Broker,
    stream: str,
    subjects: list[str],
    *,
    up_to_seq: int | None = None,
    chunk: int = 256,
) -> list[StoredMessage]:
    """The last message on each of ``subjects`` (no wildcards) that has one (at or before
    ``up_to_seq``, when given)."""
    found: list[StoredMessage] = []
    for at in range(0, len(subjects), chunk):
        wanted = subjects[at : at + chunk]
        request: dict[str, Any] = {"multi_last": wanted, "batch": len(wanted)}
        if up_to_seq is not None:
            request["up_to_seq"] = up_to_seq
        page, _ = await _batch(broker, stream, request)
        found += page
    return found


async def indexed_messages_on(broker: Broker, stream: str, subject: str) -> list[StoredMessage]:
    """Every message on the subjects matching ``subject``, oldest first, found through the
    server's subject index, for a few subjects in a long stream (where a wildcard read would
    look at every message, see :func:`messages_on`).

    The index counts the messages of each matching subject, and the last message of each
    is read in the same write: a subject counted with one message is answered by its last
    one, unless that was written after the count (then it is read again, as of the counted
    moment, so that it is not mistaken for the one counted); a subject that holds several
    (a retry, progress) is read on its own. A task's events cost one round trip and seven
    messages this way, where a read of each subject's history cost fourteen.
    """
    (counts, counted_at), lasts = await asyncio.gather(
        subject_counts(broker, stream, subject), _last_values_in_one_answer(broker, stream, subject)
    )
    last = {m.subject: m for m in lasts}
    found = [
        m for s, n in counts.items() if n == 1 and (m := last.get(s)) and m.stream_seq <= counted_at
    ]
    known = {m.subject for m in found}
    alone = [s for s, n in counts.items() if n == 1 and s not in known]
    several = [s for s, n in counts.items() if n > 1]
    pages = await asyncio.gather(
        last_of_each(broker, stream, alone, up_to_seq=counted_at),
        *(messages_on(broker, stream, s) for s in several),
    )
    found += (m for page in pages for m in page if m.stream_seq <= counted_at)
    return sorted(found, key=lambda m: m.stream_seq)


async def _last_values_in_one_answer(
    broker: Broker, stream: str, subject: str
) -> list[StoredMessage]:
    """The last message of each subject matching ``subject``, as far as one answer holds
    them (none when the server refuses that many): the caller reads the rest by subject."""
    try:
        page, _ = await _batch(broker, stream, {"multi_last": [subject], "batch": BATCH})
    except _TooMany:
        return []
    return page


class _State(msgspec.Struct):
    last_seq: int = 0
    subjects: dict[str, int] | None = None  # absent when none matches


class _Info(msgspec.Struct):
    state: _State | None = None
    total: int = 0  # subjects matching, over every page
    error: dict[str, Any] | None = None


async def subject_counts(
    broker: Broker, stream: str, subject: str, *, timeout_s: float = 5.0
) -> tuple[dict[str, int], int]:
    """How many messages each subject matching ``subject`` holds, and the stream's last
    sequence when they were counted."""
    api_subject = f"$JS.API.STREAM.INFO.{stream}"
    counts: dict[str, int] = {}
    last_seq = 0
    while True:
        request = msgspec.json.encode({"subjects_filter": subject, "offset": len(counts)})
        with translated(subject=api_subject):
            answer = await broker.shared(ReplyInbox).ask(api_subject, request, timeout_s=timeout_s)
            state, total = _decoded_info(answer.data)
        page = state.subjects or {}
        last_seq = last_seq or state.last_seq
        counts.update(page)
        if not page or len(counts) >= total:
            return counts, last_seq


def _decoded_info(data: bytes) -> tuple[_State, int]:
    """The state and the number of matching subjects of a stream-info answer."""
    try:
        info = msgspec.json.decode(data, type=_Info)
    except msgspec.DecodeError as exc:
        raise BrokerError(f"unreadable stream info: {data[:200]!r}") from exc
    if info.error is not None:
        nats.js.errors.APIError.from_error(info.error)  # raises the error's own class
    if info.state is None:
        raise BrokerError(f"stream info without a state: {data[:200]!r}")
    return info.state, info.total


class _TooMany(Exception):
    """The server refused to answer that many subjects in one batch (413)."""


async def _batch(
    broker: Broker, stream: str, request: dict[str, Any], *, timeout_s: float = 5.0
) -> tuple[list[StoredMessage], int]:
    """One batched direct get: the messages, and how many more the server says are pending."""
    return await broker.shared(DirectReplies).ask(stream, request, timeout_s=timeout_s)


class DirectReplies:
    """A connection's direct gets, answered on its one reply subscription
    (``broker.reply_inbox``): a subscription made and removed for each read cost a SUB and
    an UNSUB, and the server's interest churn, several times per task (run-once, audit)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._inbox = broker.shared(ReplyInbox)

    async def ask(
        self, stream: str, request: dict[str, Any], *, timeout_s: float
    ) -> tuple[list[StoredMessage], int]:
        subject = f"$JS.API.DIRECT.GET.{stream}"
        read = _Read(stream, asyncio.get_running_loop().create_future())
        token, reply = await self._inbox.expect(read.take)
        try:
            with translated(subject=subject):
                nc = self._broker.nc
                if not nc.is_connected:  # on this read's clock, not the client's
                    await nc.connected_within(timeout_s)
                await nc.publish(subject, msgspec.json.encode(request), reply=reply)
            try:
                async with asyncio.timeout(timeout_s):
                    return await read.done
            except TimeoutError:
                raise BrokerTimeout(f"direct get on {stream} did not finish") from None
        finally:
            self._inbox.forget(token)


class _Read:
    """One direct get's answers so far."""

    def __init__(self, stream: str, done: asyncio.Future[tuple[list[StoredMessage], int]]):
        self.stream = stream
        self.done = done
        self.found: list[StoredMessage] = []

    def take(self, msg: nats.aio.msg.Msg) -> None:
        if self.done.done():
            return
        headers = msg.headers or {}
        # A stored message may carry a header named Status too: a real status has no sequence.
        status = None if "Nats-Sequence" in headers else headers.get("Status", "")
        if status is None:
            self.found.append(_stored(msg.data, headers))
        elif status in _END:
            self.done.set_result((self.found, int(headers.get("Nats-Num-Pending", 0))))
        elif status == _TOO_MANY:
            self.done.set_exception(_TooMany())
        elif status == "503":  # no responders: no such stream, or no direct gets
            self.done.set_exception(
                StreamNotFound(
                    f"stream {self.stream} does not exist (or does not answer direct gets):"
                    " run `reach provision` (or start the coordinator, which provisions)",
                    err_code=STREAM_NOT_FOUND,
                )
            )
        else:
            self.done.set_exception(BrokerError(f"direct get on {self.stream}: status {status}"))


def _stored(data: bytes, headers: dict[str, str]) -> StoredMessage:
    return StoredMessage(
        stream_seq=int(headers.get("Nats-Sequence", 0)),
        subject=headers.get("Nats-Subject", ""),
        data=data,
        headers={k: v for k, v in headers.items() if k not in DIRECT_GET_HEADERS},
        timestamp_ns=_ns(headers.get("Nats-Time-Stamp", "")),
    )


def _ns(stamp: str) -> int:
    """RFC 3339 with up to nanoseconds (``2026-11-30T04:49:49.544575647Z``) → ns since epoch."""
    if not stamp:
        return 0
    base, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = dt.datetime.fromisoformat(base).replace(tzinfo=dt.UTC).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction or "0")[:9].ljust(9, "0"))


async def read_stream(
    broker: Broker, stream: str, filter_subject: str, *, limit: int = 10_000
) -> list[StoredMessage]:
    """Every message of ``stream`` on ``filter_subject`` (wildcards allowed), oldest first."""
    return await messages_on(broker, stream, filter_subject, limit=limit)
