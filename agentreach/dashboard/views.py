"""What the dashboard and ``reach top`` show, kept current from the broker: the same views
as a coordinator (agents, liveness, breakers, queues, workflows), read only, plus its own
fold of the events for the five metrics, dead letters and the coordinators' status."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from agentreach.agents.letters import SETTLING
from agentreach.broker import Broker, BrokerError, StreamNotFound, follow
from agentreach.broker.direct import messages_on
from agentreach.broker.errors import honour_cancellation, pause
from agentreach.broker.requests import gather_replies
from agentreach.broker.streams import per_subject_limit, stream_bounds, stream_size
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator.observability import (
    FOLDED,
    QUOTA_ANSWERS,
    BreakerView,
    Sampled,
    WorkflowCensus,
)
from agentreach.coordinator.observability.census import _follow
from agentreach.coordinator.observability.once import Routes
from agentreach.coordinator.protection.queues import QueueConfig, QueueDepths
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.dashboard import sections, series
from agentreach.dashboard.alerts import RULES, firing
from agentreach.dashboard.history import History
from agentreach.dashboard.letters import OpenLetters
from agentreach.envelopes import (
    PRIORITIES,
    DeadLetter,
    DecodeError,
    Event,
    Heartbeat,
    decode_as,
    decode_dead_letter,
    decode_json,
    decode_stored_event,
    now_ms,
)

log = structlog.get_logger("dashboard")

RECENT_LETTERS = 50
REFRESH_S = 2.0


class Heartbeats:
    """The last heartbeat of every agent, with the broker's time of writing it."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.beats: dict[str, tuple[Heartbeat, int]] = {}

    async def follow(self, ready: asyncio.Event) -> None:
        kv_name = self._broker.names.heartbeats_bucket
        await _follow(self._broker, kv_name, self._apply, ready)

    def _apply(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.beats.pop(key, None)
            return
        with contextlib.suppress(DecodeError):
            self.beats[key] = (decode_as(value, Heartbeat), now_ms())


class Board:
    """Everything the dashboard shows, current within a second or two."""

    def __init__(
        self, broker: Broker, history: History, *, read_only: bool = False, version: str = ""
    ) -> None:
        self.broker = broker
        self.history = history
        self.read_only = read_only
        self.version = version
        self.directory = AgentDirectory(broker)
        self.breakers = BreakerView(broker)
        self.heartbeats = Heartbeats(broker)
        self.census = WorkflowCensus(broker)
        self.queues: QueueDepths | None = None
        self.sampled = Sampled(broker)
        self.letters: list[tuple[int, int, DeadLetter]] = []  # (seq, stored_ms, letter)
        self.replayed: dict[str, str] = {}
        self.resolved: dict[str, dict[str, Any]] = {}
        # Each letter's replayed and resolved events in stream order: its state (letter_state),
        # all of them kept (REACH_SETTLED: as long as the letters; else REACH_EVENTS' week): a
        # letter resolved before the charts' window is not open.
        self.settling: dict[str, list[Event]] = {}
        self._kept: set[str] = set()  # the messages whose settling REACH_SETTLED told
        self.open_letters = OpenLetters(broker)
        self.replicas: list[dict[str, Any]] = []
        self.read_ms = 0  # when a refresh last read everything: what is shown is as of then
        self.unread: str | None = None  # why the last refresh failed; None when it did not
        self.worst_queue: dict[str, Any] | None = None  # the fullest queue, as of read_ms
        self.ready = asyncio.Event()
        self.history_read = asyncio.Event()  # the window's events at start are folded
        self._tasks: list[asyncio.Task[None]] = []
        # Topics seen served since the start: on a card, or routed to an agent in the window.
        self._served: set[str] = set()

    # -- running -------------------------------------------------------------------------
    async def __aenter__(self) -> Board:
        names = self.broker.names
        capacity = {
            p: await per_subject_limit(self.broker, names.dispatch_stream(p)) for p in PRIORITIES
        }
        self.queues = QueueDepths(
            self.broker, QueueConfig(capacity={p: c for p, c in capacity.items() if c > 0})
        )
        views: dict[str, Callable[[asyncio.Event], Awaitable[None]]] = {
            "directory": self.directory.follow,
            "breakers": self.breakers.follow,
            "heartbeats": self.heartbeats.follow,
            "census": self.census.follow,
            "queues": self.queues.run,
            "settling": self._follow_settling,
            "settled": self._follow_settled,
        }
        for name, view in views.items():
            ready = asyncio.Event()
            self._tasks.append(asyncio.create_task(view(ready), name=f"dashboard-{name}"))
            waiter = asyncio.create_task(ready.wait())
            await asyncio.wait({waiter, self._tasks[-1]}, return_when=asyncio.FIRST_COMPLETED)
            if self._tasks[-1].done():
                waiter.cancel()
                self._tasks[-1].result()  # raises why the view could not start
        for loop in (self._fold, self._refresh):
            self._tasks.append(asyncio.create_task(loop()))
        await self.refresh()
        self.ready.set()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(*self._tasks)

    def _serves(self, topic: str) -> bool:
        """Whether ``topic`` was served: on an agent's card since the start, or routed to an
        agent in the window read. A task nobody ever served is no failure of ours; one of a
        topic whose agents were all forgotten is, as in the metrics (a workflow's topic never
        ends as no_route)."""
        if topic not in self._served and self.directory.serving(topic):
            self._served.add(topic)
        return topic in self._served

    async def _fold(self) -> None:
        names = self.broker.names
        # Refusals and alerts make no chart here; a caller past its quota can send them by
        # the thousand, so they are not read back over the whole window at every start.
        charted = (kind for kind in FOLDED if kind not in ("rejected", "alert", *QUOTA_ANSWERS))
        # As the metrics count: an agent's report only of an attempt routed to it (a forged
        # `completed` of a message never routed made 413 completions of 409 dispatches).
        routes = Routes(names)
        async for msg in follow(
            self.broker,
            stream=names.events_stream,
            filter_subjects=tuple(names.events_of_kind(k) for k in charted),
            since_ms=now_ms() - self.history.since_ms_back,
            caught_up=self.history_read,
        ):
            honour_cancellation()
            try:
                event = decode_stored_event(msg.data, msg.headers)
            except DecodeError:
                continue
            await routes.look_up(self.broker, (msg,))  # a routing before the window's start
            # Not an agent's `dead_lettered`, nor a ghost; a report with its routing's times.
            if (counted := routes.vouched(msg.subject, event)) is not None:
                if counted.event == "routed":
                    self._served.add(counted.topic)
                self.history.fold(counted, msg.timestamp_ms, served=self._serves)

    async def _follow_settling(self, ready: asyncio.Event) -> None:
        """Every ``replayed`` and ``resolved`` event REACH_EVENTS keeps, then each new one."""
        names = self.broker.names
        await self._settling_in(ready, names.events_stream, names.events_of_kind, kept=False)

    async def _follow_settled(self, ready: asyncio.Event) -> None:
        """The same events as REACH_SETTLED keeps them, as long as the letters: what they say
        of a message replaces what REACH_EVENTS said (a letter settled before REACH_SETTLED
        was there has only those)."""
        names = self.broker.names
        try:
            await stream_bounds(self.broker, names.settled_stream)
        except StreamNotFound:
            log.warning("REACH_SETTLED is not provisioned: states from REACH_EVENTS (a week)")
            ready.set()
            return
        await self._settling_in(ready, names.settled_stream, names.settled_of_kind, kept=True)

    async def _settling_in(
        self, ready: asyncio.Event, stream: str, of_kind: Callable[[str], str], *, kept: bool
    ) -> None:
        async for msg in follow(
            self.broker,
            stream=stream,
            filter_subjects=tuple(of_kind(k) for k in SETTLING),
            since_ms=0,
            caught_up=ready,
        ):
            honour_cancellation()
            try:
                event = decode_stored_event(msg.data, msg.headers)
            except DecodeError:
                continue
            if kept and event.message_id not in self._kept:
                self._kept.add(event.message_id)
                self.settling[event.message_id] = []
            if kept or event.message_id not in self._kept:
                self.settling.setdefault(event.message_id, []).append(event)
            if event.event == "replayed":
                self.replayed[event.message_id] = str(event.detail.get("replayed_as", ""))
            elif event.event == "resolved":
                self.resolved[event.message_id] = {**event.detail, "at_ms": msg.timestamp_ms}

    async def _refresh(self) -> None:
        while True:
            await pause(REFRESH_S)
            try:
                await self.refresh()
            except BrokerError as exc:
                log.warning("cannot refresh the dashboard's views", error=str(exc))

    async def refresh(self) -> None:
        """Dead letters (their counts by reason after the open ones), coordinators and the
        sampled metrics, read again."""
        try:
            letters = await self._recent_letters()
            await self.open_letters.read(self.settling)
            # Counted after the open letters were read, so the total holds every one of them
            # (in a loop of its own, it lagged behind: more open letters than kept).
            await self.sampled.sample()
            # A busy replica may take seconds to answer: not shown as none for that.
            answers = await gather_replies(
                self.broker, self.broker.names.status, wait_s=0.3, first_within_s=3
            )
        except BrokerError as exc:
            self.unread = str(exc)
            raise
        replicas = []
        for answer in answers:
            with contextlib.suppress(DecodeError):
                replicas.append(decode_json(answer))
        # Replaced in one step: a snapshot taken while the replicas answer must not see
        # an empty list (it did, for the wait, at every refresh).
        self.letters, self.replicas = letters, replicas
        self._served.update(
            topic for card in self.directory.cards.values() for topic in card.intents
        )
        self.read_ms, self.unread = now_ms(), None
        queues = self._queues()
        fullest, self.worst_queue = series.worst(queues)
        over = RULES["queue_fill"]
        self.history.sample(  # at read_ms: what a stale snapshot is as of must hold a sample
            self.read_ms,
            queue_fill=fullest,
            isolated=len(self.breakers.isolated),
            queues_over={
                f"{q['agent_id']} {q['priority']}" for q in queues if over.compares(series.fill(q))
            },
        )

    def staleness(self) -> tuple[int | None, str | None]:
        """Since when what is shown is not current, and why; ``(None, None)`` while the
        dashboard reads NATS. The views then keep the last state they saw."""
        if not self.broker.connected:
            why = f"lost its connection to NATS ({self.broker.shown_url}); reconnecting"
            return self.read_ms or None, why
        if self.unread is not None:
            return self.read_ms or None, f"cannot read NATS: {self.unread}"
        return None, None

    async def _recent_letters(self) -> list[tuple[int, int, DeadLetter]]:
        names = self.broker.names
        _, last = await stream_size(self.broker, names.dlq_stream)
        if not last:
            return []
        stored = await messages_on(
            self.broker,
            names.dlq_stream,
            names.dlq_wildcard,
            from_seq=max(1, last - 4 * RECENT_LETTERS),
        )
        found = []
        for message in stored[-RECENT_LETTERS:]:
            with contextlib.suppress(DecodeError):
                found.append(
                    (
                        message.stream_seq,
                        message.timestamp_ms,
                        decode_dead_letter(message.data, message.headers, stored=True),
                    )
                )
        return found[::-1]

    # -- the snapshot (docs: the dashboard's HTTP API) -----------------------------------
    def _queues(self) -> list[dict[str, Any]]:
        """Each running agent's queue of each priority, with its depth and capacity."""
        if self.queues is None:
            return []
        running = [c.agent_id for c in self.directory.cards.values() if c.status == "running"]
        return [
            {
                "agent_id": agent,
                "priority": p,
                "depth": self.queues.depth(agent, p),
                "capacity": self.queues.capacity(p),
            }
            for agent in running
            for p in PRIORITIES
        ]

    def as_of_ms(self) -> int:
        """The moment what is shown is computed at: now while live; while not, when it last
        read NATS, so windows do not slide over a time it knows nothing of."""
        stale_since, _ = self.staleness()
        return now_ms() if stale_since is None else stale_since

    def metrics(self, *, full: bool) -> dict[str, Any]:
        """The snapshot's ``metrics`` (``at_ms``: this process's clock now, for the page)."""
        return {**series.metrics(self, at_ms=self.as_of_ms(), full=full), "at_ms": now_ms()}

    def alerts(self, metrics: dict[str, Any]) -> list[dict[str, Any]]:
        return firing(metrics["series"])

    def system(self) -> dict[str, Any]:
        stale_since, stale_why = self.staleness()
        return {
            "prefix": self.broker.names.prefix,
            "version": self.version,
            "nats": self.broker.shown_url,
            "connected": self.broker.connected,
            "stale_since_ms": stale_since,
            "stale_why": stale_why,
            "replicas": [
                {
                    "replica": r.get("replica"),
                    "ready": r.get("ready"),
                    "duties": r.get("duties", []),
                }
                for r in self.replicas
            ],
            "read_only": self.read_only,
            "source": "events",
        }

    def snapshot_section(self, name: str) -> Any:
        """One of the sections that the event stream sends when it changed."""
        return getattr(sections, name)(self)

    def snapshot(self) -> dict[str, Any]:
        metrics = self.metrics(full=True)
        return {
            "v": 1,
            "at_ms": metrics.pop("at_ms"),
            "system": self.system(),
            "metrics": metrics,
            "alerts": self.alerts(metrics),
            "agents": sections.agents(self),
            "dead_letters": sections.dead_letters(self),
            "workflows": sections.workflows(self),
        }
