"""The connection to NATS: one async context manager that owns it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Callable, Sequence
from enum import Enum
from types import TracebackType
from typing import Any, Self, TypeVar

import nats
import nats.errors
import nats.js
import nats.js.errors
from nats.js import api
from nats.js.kv import KeyValue
from nats.protocol.command import hpub_cmd

from agentreach.broker.auth import Auth
from agentreach.broker.bucket import Bucket, bound_kv
from agentreach.broker.client import Client as NATS
from agentreach.broker.connect_failure import FailedAttempts
from agentreach.broker.dedup import MSG_ID, sealed
from agentreach.broker.errors import (
    AuthenticationFailed,
    BrokerError,
    ConnectError,
    TlsFailed,
    translated,
)
from agentreach.broker.failover import ELECTION_BUDGET_S, through_elections
from agentreach.broker.link import Link
from agentreach.broker.messages import Inbound, InboundHandler, Subscription, core_callback
from agentreach.broker.names import Names
from agentreach.broker.pipelined import Outgoing, PipelinedPublisher
from agentreach.broker.record_seal import RecordSeal, headed_buckets
from agentreach.broker.urls import jittered_reconnect, redacted, resolve_url, server_list
from agentreach.logs import get_logger

T = TypeVar("T")
S = TypeVar("S")

log = get_logger("broker")

_FIRST_CONNECT_ATTEMPTS = 2
WAIT_FIRST_S = 1.0
WAIT_CAP_S = 30.0
# A server that stops answering (frozen, cut off, its host gone) is left after about
# PING_INTERVAL_S * (MAX_OUTSTANDING_PINGS + 2): 20 s, where nats-py's own 2 min x 2 is 6 min.
PING_INTERVAL_S = 5
MAX_OUTSTANDING_PINGS = 2


@contextlib.asynccontextmanager
async def connected(
    broker: Broker | None,
    nats_url: str | None,
    *,
    name: str,
    names: Names | None = None,
    wait: bool = False,
    auth: Auth | None = None,
) -> AsyncIterator[Broker]:
    """``broker`` when the caller shares one (it stays open), else a connection of our own
    (which waits for the server to come up when ``wait`` is set)."""
    if broker is not None:
        yield broker
        return
    async with Broker(nats_url, name=name, names=names, wait=wait, auth=auth) as own:
        yield own


class _State(Enum):
    UNOPENED = 1
    OPEN = 2
    CLOSED = 3


class Broker:
    """A NATS connection with JetStream, ready for Agent-Reach.

    ``url`` may list several servers, comma-separated (a cluster's seed list). Once
    connected it reconnects forever (a service outlives a server restart), to whichever
    server answers, after a jittered pause so a fleet does not come back in step. The first
    connect fails fast with :class:`ConnectError`, unless ``wait`` is set: then it tries
    again after 1, 2, 4 … s (capped at 30 s, jittered), saying once per try what it waits
    for, and never gives up. A JetStream write rides out a leader election for up to
    ``election_budget_s``.

        async with Broker(url, name="coordinator") as broker:
            await broker.publish(...)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        name: str = "agent-reach",
        names: Names | None = None,
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        wait: bool = False,
        auth: Auth | None = None,
        election_budget_s: float = ELECTION_BUDGET_S,
    ) -> None:
        self.url = resolve_url(url)
        self.auth = auth if auth is not None else Auth.from_env()
        self.shown_url = redacted(self.url)
        self.servers = server_list(self.url)  # raises ConnectError naming a malformed entry
        self.election_budget_s = election_budget_s
        self._wait = wait
        self.name = name
        self.names = names or Names()
        self.request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._nc: NATS | None = None
        self._js: nats.js.JetStreamContext | None = None
        self._buckets: dict[str, KeyValue] = {}
        self._shared: dict[type, Any] = {}
        self._state = _State.UNOPENED
        self.opened_by = "Broker"  # what a "not open" error says to enter (a ReachClient, say)
        self.link = Link(self.shown_url)
        # With a secret, every Nats-Msg-Id this connection publishes is made unguessable:
        # dedup is stream-wide, so whoever may publish into a stream could otherwise
        # suppress a message by publishing its id first (see :meth:`publish`).
        self.dedup_secret: bytes | None = None
        # Buckets whose records this connection seals and checks, by name (see record_seal).
        self.record_seals: dict[str, RecordSeal] = {}
        # Buckets whose values without headers are nobody's (record_seal.headed_buckets):
        # a secured party's; a coordinator adds them with its seal key, whatever its creds.
        self.headed_buckets: set[str] = set()

    async def __aenter__(self) -> Self:
        if self._state is not _State.UNOPENED:
            raise BrokerError("a Broker cannot be opened twice; create a new one")
        self._state = _State.OPEN
        tries = 0
        while True:
            try:
                self._nc = await self._connect()
                break
            except ConnectError as exc:
                if not self._wait or isinstance(exc, AuthenticationFailed | TlsFailed):
                    self._state = _State.CLOSED
                    raise
                wait_s = min(WAIT_CAP_S, WAIT_FIRST_S * 2**tries) * random.uniform(0.8, 1.2)
                tries += 1
                log.warning(
                    "waiting for NATS",
                    url=self.shown_url,
                    error=str(exc),
                    retry_in_s=round(wait_s, 1),
                )
                await asyncio.sleep(wait_s)
        if tries:
            log.info("connected to NATS", url=self.shown_url)
        self._nc.options["max_reconnect_attempts"] = -1
        if self.auth.identity is not None:
            self.headed_buckets.update(headed_buckets(self.names))
        self.link.connected(self._nc)
        self._js = self._nc.jetstream(timeout=self.request_timeout)
        return self

    async def _connect(self) -> NATS:
        servers = self.servers
        options = self.auth.connect_options(servers)
        nc = NATS()
        attempts = self.link.attempts = FailedAttempts(nc, self.auth, servers=servers)
        deadline_s = self._first_connect_deadline_s()
        try:
            # nats-py bounds each step of an attempt, not the whole: a hang of its own
            # (nats-io/nats.py#718) must not hold a process forever with nothing said.
            async with asyncio.timeout(deadline_s):
                await nc.connect(
                    servers=servers,
                    name=self.name,
                    connect_timeout=self._connect_timeout,
                    allow_reconnect=True,
                    # Bounded for the first connect, so a wrong URL fails fast (a waiting
                    # one has its own backoff); unbounded once connected (set by the
                    # caller), so a service rides out restarts.
                    max_reconnect_attempts=1 if self._wait else _FIRST_CONNECT_ATTEMPTS,
                    # Each process waits its own time, so a fleet does not reconnect in
                    # step: for the first connect here, and for every reconnect in the
                    # handler.
                    reconnect_time_wait=random.uniform(0.5, 1.5),
                    reconnect_to_server_handler=jittered_reconnect(),
                    ping_interval=PING_INTERVAL_S,
                    max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                    **self.link.callbacks(),
                    **options,
                )
        except TimeoutError:
            raise attempts.timed_out(self.shown_url, deadline_s) from None
        except Exception as exc:
            raise attempts.error(self.shown_url, exc) from None
        return nc

    def _first_connect_deadline_s(self) -> float:
        """Every attempt at every server, each step of one taking up to connect_timeout
        (TCP, INFO, TLS, PONG), with nats-py's pause between them."""
        attempts = 2 if self._wait else _FIRST_CONNECT_ATTEMPTS + 1
        per_attempt_s = 4 * self._connect_timeout + 1.5
        return attempts * len(self.servers) * per_attempt_s

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush what is pending and close; safe to call twice. Not ``drain()``: it waits out
        the server side of every open pull request, holding a shutdown for its timeout."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self.link.client = None
        for helper in self._shared.values():
            if hasattr(helper, "close"):
                await helper.close()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):  # disconnected: nothing can be flushed
                await self._nc.flush(timeout=2)
            # A connection lost just now fails its last write; it is closed all the same.
            with contextlib.suppress(ConnectionError, nats.errors.Error):
                await self._nc.close()

    @property
    def nc(self) -> NATS:
        if self._nc is None or self._state is not _State.OPEN:
            raise BrokerError(
                f"the {self.opened_by} is not open; use `async with {self.opened_by}(…)`"
            )
        return self._nc

    @property
    def js(self) -> nats.js.JetStreamContext:
        if self._js is None or self._state is not _State.OPEN:
            raise BrokerError(
                f"the {self.opened_by} is not open; use `async with {self.opened_by}(…)`"
            )
        return self._js

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        seal_id: bool = True,
        since_break: int | None = None,
        budget_s: float | None = None,
    ) -> api.PubAck:
        """JetStream publish; a ``Nats-Msg-Id`` header makes the stream drop duplicates.
        While the stream has no leader (an election) the publish is made again, for up to
        ``budget_s`` (``election_budget_s``); NoStreamError at once when no stream listens.
        ``seal_id=False``: the ``Nats-Msg-Id`` as given (someone else's id), not sealed.
        ``since_break``: ``link.breaks`` when the decision the write carries was made; once
        the connection broke after it, ConnectionBroke, unsent."""
        if seal_id:
            headers = self.sealed(headers)
        wait_s = timeout or self.request_timeout
        publisher = self.shared(PipelinedPublisher)
        return await through_elections(
            lambda: publisher.publish(
                subject, data, headers=headers, timeout_s=wait_s, since_break=since_break
            ),
            self,
            subject=subject,
            retry_timeouts=bool(headers and MSG_ID in headers),
            budget_s=budget_s,
        )

    def shared(self, kind: Callable[[Broker], S]) -> S:
        """This connection's one ``kind``, made on first use: the helpers that answer on one
        subscription per connection (publish acks, direct gets)."""
        helper = self._shared.get(kind)  # type: ignore[call-overload]
        if helper is None:
            self.nc  # noqa: B018 - raises BrokerError when the Broker is not open
            helper = self._shared[kind] = kind(self)  # type: ignore[index]
        return helper  # type: ignore[no-any-return]

    def sealed(self, headers: dict[str, str] | None) -> dict[str, str] | None:
        """``headers`` with its ``Nats-Msg-Id`` made unguessable (see broker.dedup)."""
        return sealed(headers, self.dedup_secret)

    async def publish_all(
        self, messages: Sequence[Outgoing], *, timeout: float | None = None
    ) -> list[BrokerError | None]:
        """JetStream publishes in flight together (see :mod:`agentreach.broker.pipelined`):
        for each message None when stored, or its error. Nothing is written again here."""
        return await self.shared(PipelinedPublisher).publish_all(
            messages, timeout_s=timeout or self.request_timeout
        )

    async def publish_core(
        self, subject: str, data: bytes, *, headers: dict[str, str] | None = None, reply: str = ""
    ) -> None:
        """Plain core-NATS publish (replies to an inbox; a request names its ``reply``)."""
        with translated(subject=subject):
            await self.nc.publish(subject, data, reply=reply, headers=headers)

    async def publish_header_block(
        self, subject: str, block: bytes, data: bytes, *, timeout_s: float = 5.0
    ) -> int:
        """A JetStream publish with ``block`` as its header block, unchecked (nats-py refuses
        a name it cannot send, such as ``Bad Key``), as any party's own client can store it:
        for the conformance kit. Returns the sequence it was stored at."""
        with translated(subject=subject):
            sub = await self.nc.subscribe(inbox := self.nc.new_inbox(), max_msgs=1)
            try:
                await self.nc._send_command(hpub_cmd(subject, inbox, block, data))
                await self.nc.flush()
                answer = await sub.next_msg(timeout=timeout_s)
            finally:
                await sub.unsubscribe()
        ack = json.loads(answer.data)
        if "seq" not in ack:
            raise BrokerError(f"{subject}: not stored: {answer.data[:200]!r}")
        return int(ack["seq"])

    async def kv(self, bucket: str) -> KeyValue:
        """The nats-py KV bucket (cached per connection), for this package's own use."""
        if bucket not in self._buckets:
            self._buckets[bucket] = await bound_kv(self, bucket)
        return self._buckets[bucket]

    async def bucket(self, name: str, kind: type[T]) -> Bucket[T]:
        """The KV bucket ``name`` holding records of ``kind``."""
        seal, headed = self.record_seals.get(name), name in self.headed_buckets
        return Bucket(self, await self.kv(name), kind, name, seal=seal, headed=headed)

    async def subscribe(
        self, subject: str, handler: InboundHandler | None = None, *, queue: str = "", **limit: int
    ) -> Subscription:
        """A core subscription; ``handler`` gets each message (or read them with ``next``).
        Subscribers sharing a ``queue`` name each get a share of the messages. ``limit``:
        nats-py's ``pending_msgs_limit`` (messages past it are dropped, not queued), say."""
        callback = core_callback(handler) if handler is not None else None
        with translated(subject=subject):
            return Subscription(await self.nc.subscribe(subject, queue, callback, **limit))

    async def request(self, subject: str, data: bytes = b"", *, timeout: float) -> Inbound:
        """Ask and wait for one answer: raises NoResponders at once when nobody listens,
        BrokerTimeout when nobody answers within ``timeout`` seconds."""
        with translated(subject=subject):
            return Inbound(await self.nc.request(subject, data, timeout=timeout))

    @property
    def max_payload(self) -> int:
        """The largest message the server takes, in bytes."""
        return self.nc.max_payload

    def new_inbox(self) -> str:
        """A unique subject to receive answers on."""
        return self.nc.new_inbox()

    async def flush(self, timeout: float = 2.0) -> None:
        """Wait until the server has seen everything published so far."""
        with translated():
            await self.nc.flush(timeout=timeout)

    async def connected_within(self, within_s: float) -> bool:
        """Whether the connection is up, or comes back within ``within_s``."""
        try:
            await self.nc.connected_within(within_s)
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError):
            return False
        return True

    @property
    def connected(self) -> bool:
        """Whether the connection is up now (it may be reconnecting)."""
        return self._nc is not None and self._nc.is_connected

    @property
    def server(self) -> str:
        """The server connected to now (host:port, never credentials), or ``""``."""
        return self.link.server

    @property
    def reconnects(self) -> int:
        """How often the connection came back (views may need a grace)."""
        return self.link.reconnects

    @property
    def lost(self) -> asyncio.Event:
        """Set once the connection is gone for good without close() (see ``lost_why``)."""
        return self.link.lost

    @property
    def lost_why(self) -> str:
        return self.link.lost_why
