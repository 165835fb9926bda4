"""State metrics: gauges of how things are now, computed when Prometheus scrapes.

Every replica holds the same views (agents and liveness, breakers, queue depths, workflows
in flight), so every replica exports the same values and the rules take ``max``, never
``sum``. The gauges are computed from the views at scrape time (no ``set()`` from handlers),
so an agent that leaves drops out of the output by itself. A replica that is not ready
exports none of them: before its views are loaded it would report zeros, and ``max``
cannot tell a zero from a truth.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import msgspec
import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agentreach.broker import Broker, BrokerError
from agentreach.broker.errors import pause
from agentreach.broker.requests import gather_replies
from agentreach.broker.streams import consumer_backlog, stream_fill, subject_counts
from agentreach.coordinator.observability.census import WorkflowCensus
from agentreach.coordinator.observability.config_drift import ConfigDrift
from agentreach.coordinator.observability.open_letters import OpenLetters
from agentreach.coordinator.protection.queues import QueueDepths
from agentreach.coordinator.protection.server_answers import DROPPED
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.envelopes import DEAD_LETTER_REASONS, PRIORITIES, BreakerRecord, now_ms

OTHER_REASON = "other"  # a dead letter's reason the protocol does not name, past the first
NAMED_OTHER_REASONS = 10  # a routing rule's reasons (`to: {dlq: maintenance}`): most letters first

log = structlog.get_logger("coordinator.metrics")

LIVENESS_STATES = ("UNKNOWN", "ONLINE", "SUSPECT", "OFFLINE", "STOPPED")
BREAKER_STATES = ("closed", "open", "half_open")
SAMPLE_S = 5.0
# The replicas' status is read more often: a workflow another replica was just started with
# (a rolling restart) is left to it only once read, and its tasks were dead-lettered
# `no_route` meanwhile, for up to 5 s (a trial).
REPLICAS_S = 1.0
REPLICAS_WAIT_S = 0.5  # how long the status answers of the replicas are gathered
WORKFLOW_READS_KEPT = 3


@dataclass
class Views:
    """What the gauges read; the coordinator's own views (or a dashboard's copies)."""

    directory: AgentDirectory
    breakers: Callable[[], dict[str, BreakerRecord]]
    queues: QueueDepths
    census: WorkflowCensus
    ready: Callable[[], bool]
    leases_held: Callable[[], dict[str, bool]] = dict  # duty -> whether this replica runs it
    # Tasks this replica holds back because no agent can take them, by topic (its own).
    held: Callable[[], dict[str, int]] = dict
    info: dict[str, str] = field(default_factory=dict)


class Sampled:
    """Numbers read from the broker every few seconds rather than at each scrape; the open
    letters only when given ``open_letters`` (a dashboard keeps its own)."""

    def __init__(self, broker: Broker, open_letters: OpenLetters | None = None) -> None:
        self._broker = broker
        self.intake_backlog: int | None = None
        self.dlq_by_reason: dict[str, int] = {}
        self.replicas: int | None = None
        self.workflows_elsewhere: frozenset[str] = frozenset()  # what the replicas serve
        self._workflows_read: deque[frozenset[str]] = deque(maxlen=WORKFLOW_READS_KEPT)
        self.drift = ConfigDrift()
        self.open_letters = open_letters
        self.open_letters_read = False
        self.stream_fill: dict[str, tuple[int, int]] = {}  # bytes held, max_bytes

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(SAMPLE_S, self.sample_streams, "stream sizes"))
            group.create_task(self._every(REPLICAS_S, self.read_replicas, "the replicas"))

    @staticmethod
    async def _every(period_s: float, sample: Callable[[], Awaitable[None]], what: str) -> None:
        while True:
            try:
                await sample()
            except BrokerError as exc:
                log.debug("cannot sample", what=what, error=str(exc))
            await pause(period_s)

    async def sample(self) -> None:
        """Everything, now."""
        await self.sample_streams()
        await self.read_replicas()

    async def sample_streams(self) -> None:
        names = self._broker.names
        self.intake_backlog = await consumer_backlog(
            self._broker, names.tasks_stream, names.coordinator_intake
        )
        counts = await subject_counts(self._broker, names.dlq_stream, names.dlq_wildcard)
        by_reason: dict[str, int] = {}
        start = len(names.prefix) + len(".dlq.")
        for subject, count in counts.items():
            reason = subject[start:].split(".", 1)[0]
            by_reason[reason] = by_reason.get(reason, 0) + count
        labels = reason_labels(by_reason)
        self.dlq_by_reason = {}
        for reason, count in by_reason.items():
            label = labels[reason]
            self.dlq_by_reason[label] = self.dlq_by_reason.get(label, 0) + count
        self.stream_fill = await _fill_of(self._broker, names.limited_streams)
        if self.open_letters is not None:
            await self.open_letters.read()
            self.open_letters_read = True

    async def read_replicas(self) -> None:
        names = self._broker.names
        # Every replica answers a status request; the count lets a rule see a replica that
        # runs but is not scraped (its share of the counters would be missing silently).
        answers = await gather_replies(self._broker, names.status, wait_s=REPLICAS_WAIT_S)
        self.replicas = len(answers)
        # Of the last few reads: a replica that answered one late keeps its workflows.
        self._workflows_read.append(frozenset(_workflows_in(answers)))
        self.workflows_elsewhere = frozenset().union(*self._workflows_read)
        self.drift.seen(answers)


class StateCollector(Collector):
    """Yields the state gauges from the views, at each scrape."""

    def __init__(self, views: Views, sampled: Sampled) -> None:
        self._views = views
        self._sampled = sampled

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed at collection: nothing to describe ahead

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        views = self._views
        dropped = CounterMetricFamily(
            "reach_messages_dropped",
            "Unreadable messages and server answers aimed at our subjects, dropped (one a"
            " minute per kind is dead-lettered instead), by where.",
            labels=["where"],
        )
        for where, count in sorted(DROPPED.items()):
            dropped.add_metric([where], count)
        yield dropped
        ready = views.ready()
        yield _gauge(
            "reach_coordinator_ready", "1 when /readyz would answer 200.", [], [([], ready)]
        )
        info = sorted(views.info.items())
        yield _gauge(
            "reach_coordinator_info",
            "This replica's identity.",
            [k for k, _ in info],
            [([v for _, v in info], 1)],
        )
        yield _gauge(
            "reach_lease_held",
            "1 on the replica that runs a duty; the sum over replicas should be 1 (0 for up"
            " to lease_ttl_s after its holder died, until another replica takes the lease).",
            ["duty"],
            [([duty], held) for duty, held in views.leases_held().items()],
        )
        if not ready:
            return
        yield from self._queues()
        yield from self._agents()
        yield from self._breakers()
        yield from self._workflows()
        yield from self._sampled_gauges()
        yield _gauge(
            "reach_tasks_held",
            "Tasks this replica holds back because no agent can take them now (none live, all"
            " isolated or SUSPECT), by topic; replicas hold different tasks: sum them.",
            ["topic"],
            [([t], n) for t, n in sorted(self._views.held().items())],
        )

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        queues = self._views.queues
        # Every running agent at every priority, so an empty queue reads 0, not "no data".
        running = [
            c.agent_id for c in self._views.directory.cards.values() if c.status == "running"
        ]
        slots = sorted(queues.slots() | {(a, p) for a in running for p in PRIORITIES})
        yield _gauge(
            "reach_queue_depth",
            "Messages queued or unacknowledged in an agent's dispatch subject.",
            ["agent", "priority"],
            [([a, p], queues.depth(a, p)) for a, p in slots],
        )
        yield _gauge(
            "reach_queue_capacity",
            "Per-agent queue capacity at this priority (enforced by the broker).",
            ["priority"],
            [([p], queues.capacity(p)) for p in PRIORITIES],
        )
        yield _gauge(
            "reach_queue_above_watermark",
            "1 while the router does not feed this queue (above high, not yet below low).",
            ["agent", "priority"],
            [([a, p], queues.why_full(a, p) is not None) for a, p in slots],
        )

    def _agents(self) -> Iterator[GaugeMetricFamily]:
        directory = self._views.directory
        counts = dict.fromkeys(LIVENESS_STATES, 0)
        quarantined = 0
        for card in directory.cards.values():
            judged = directory.liveness.get(card.agent_id)
            if card.status != "running":
                counts["STOPPED"] += 1
            else:
                counts[judged.state if judged else "UNKNOWN"] += 1
            quarantined += bool(judged and judged.quarantined)
        yield _gauge(
            "reach_agents",
            "Registered agents by liveness state (STOPPED: stopped on purpose).",
            ["state"],
            [([s], n) for s, n in counts.items()],
        )
        yield _gauge(
            "reach_agents_quarantined",
            "Agents quarantined for flapping (`reach agents clear ID` lifts it).",
            [],
            [([], quarantined)],
        )

    def _breakers(self) -> Iterator[GaugeMetricFamily]:
        records = self._views.breakers()
        isolated = sum(1 for r in records.values() if not r.intent and r.state != "closed")
        yield _gauge(
            "reach_isolated_agents",
            "Agents isolated after consecutive failures (open or half-open).",
            [],
            [([], isolated)],
        )
        samples = [
            ([r.agent_id, r.intent, state], r.state == state)
            for r in sorted(records.values(), key=lambda r: r.key)
            for state in BREAKER_STATES
        ]
        yield _gauge(
            "reach_breaker_state",
            'Breaker state per (agent, intent), one-hot; intent="" is the agent\'s isolation.',
            ["agent", "intent", "state"],
            samples,
        )

    def _workflows(self) -> Iterator[GaugeMetricFamily]:
        counts = self._views.census.by_status()
        yield _gauge(
            "reach_workflows",
            "Workflow instances in flight.",
            ["workflow", "status"],
            [([w, s], n) for (w, s), n in sorted(counts.items())],
        )

    def _sampled_gauges(self) -> Iterator[GaugeMetricFamily]:
        backlog = self._sampled.intake_backlog
        if backlog is not None:
            yield _gauge(
                "reach_intake_pending",
                "Tasks in REACH_TASKS not routed yet (pending or being handled).",
                [],
                [([], backlog)],
            )
        if self._sampled.replicas:
            yield _gauge(
                "reach_coordinator_replicas",
                "Coordinator replicas that answer reach.ctl.status (this one included).",
                [],
                [([], self._sampled.replicas)],
            )
        if self._sampled.drift.configs:
            yield _gauge(
                "reach_coordinator_configs",
                "Distinct configurations the answering replicas run (1: all alike).",
                [],
                [([], self._sampled.drift.configs)],
            )
        yield _gauge(
            "reach_dlq_messages",
            "Dead letters kept in REACH_DLQ, by reason.",
            ["reason"],
            [([r], n) for r, n in sorted(self._sampled.dlq_by_reason.items())],
        )
        if self._sampled.open_letters_read:
            yield from _open_letter_gauges(self._sampled)
        yield from _stream_gauges(self._sampled)


def reason_labels(counts: dict[str, int]) -> dict[str, str]:
    """Each letter reason's label: anyone can have the server store a message on
    ``reach.dlq.<anything>.…`` (a direct get's answer), and 100,000 such reasons made
    200,000 series. The reasons of the protocol are labels, and the
    :data:`NAMED_OTHER_REASONS` others with the most letters (a routing rule's own, such as
    ``maintenance``, shown as ``other`` before: an outside operator trial); the rest ``other``."""
    others = sorted(
        (r for r in counts if r not in DEAD_LETTER_REASONS), key=lambda r: (-counts[r], r)
    )
    named = set(others[:NAMED_OTHER_REASONS]) | set(DEAD_LETTER_REASONS)
    return {reason: reason if reason in named else OTHER_REASON for reason in counts}


async def _fill_of(broker: Broker, streams: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """What each stream a ``limits:`` key bounds holds, and its byte limit (the streams not
    there left out)."""
    fill = {}
    for stream in streams:
        # Not there (a secured deployment has no payload store), or not this party's to read.
        with contextlib.suppress(BrokerError):
            fill[stream] = await stream_fill(broker, stream)
    return fill


def _stream_gauges(sampled: Sampled) -> Iterator[GaugeMetricFamily]:
    fill = sorted(sampled.stream_fill.items())
    yield _gauge(
        "reach_stream_bytes",
        "Bytes held by each stream a limits: key may bound (intake, dead letters, events,"
        " payloads), whether or not one does.",
        ["stream"],
        [([stream], held) for stream, (held, _) in fill],
    )
    yield _gauge(
        "reach_stream_max_bytes",
        "The byte limit of each such stream that has one (full, it refuses new writes).",
        ["stream"],
        [([stream], limit) for stream, (_, limit) in fill if limit > 0],
    )


def _open_letter_gauges(sampled: Sampled) -> Iterator[GaugeMetricFamily]:
    letters = sampled.open_letters
    assert letters is not None
    # Every reason REACH_DLQ keeps, so a reason whose letters were all dealt with reads 0.
    counts = dict.fromkeys(sampled.dlq_by_reason, 0)
    for reason, count in letters.by_reason().items():
        label = reason if reason in counts and reason != OTHER_REASON else OTHER_REASON
        counts[label] = counts.get(label, 0) + count
    yield _gauge(
        "reach_dlq_open",
        "Dead letters in REACH_DLQ nobody has replayed or resolved yet, by reason.",
        ["reason"],
        [([r], n) for r, n in sorted(counts.items())],
    )
    oldest = letters.oldest_stored_ms()
    yield _gauge(
        "reach_dlq_oldest_open_seconds",
        "How long the oldest open dead letter has waited (0 when none is open).",
        [],
        [([], 0 if oldest is None else max(0, now_ms() - oldest) / 1000)],
    )


def _gauge(
    name: str, help: str, labels: list[str], samples: list[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help, labels=labels)
    for values, value in samples:
        family.add_metric(values, float(value))
    return family


def _workflows_in(answers: list[bytes]) -> Iterator[str]:
    """The workflows the replicas' status answers name (those of older replicas name none)."""
    for answer in answers:
        try:
            named = msgspec.json.decode(answer).get("workflows") or []
        except (msgspec.DecodeError, AttributeError):
            continue
        yield from (name for name in named if isinstance(name, str))
