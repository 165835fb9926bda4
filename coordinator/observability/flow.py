"""Flow metrics: counters and histograms of what happened, each event counted once.

The events are taken from ``REACH_EVENTS`` through one durable consumer that every
coordinator replica shares (``coordinator-metrics``), so JetStream hands each event to one
replica, which counts it as it arrives: the consumer acknowledges nothing, since an ack per
event was a sixth of the messages a task costs. Each replica exports what it counted;
the alert rules add the replicas up (``sum(rate(...))``). A replica that restarts starts
from 0, which ``rate()`` reads as a reset once scraped (it counts only after: see
``AfterFirstScrape``); the consumer resumes where it stopped, so events published while
no replica ran are counted late, never lost (the lag: ``reach_metrics_feed_lag_seconds``).
What a replica counted but nobody scraped before it died is lost with it: at most one
scrape interval of its share (and the batch it had fetched and not yet counted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector, Metric

from agentreach.broker import Delivery
from agentreach.broker.names import Names
from agentreach.coordinator.observability.labels import (
    ALERT_PROBLEMS,
    BREAKER_EVENTS,
    FOLDED,
    OTHER_PROBLEM,
    OTHER_TOPIC,
    QUOTA,
    REJECTIONS,
    TRANSITIONS,
    WORKFLOW_ENDS,
    WORKFLOW_STATUSES,
    TopicLabels,
    rejection_kind,
    transition_label,
)
from agentreach.coordinator.observability.once import Ends, Redeliveries, Routes
from agentreach.envelopes import (
    DEAD_LETTER_REASONS,
    PRIORITIES,
    DecodeError,
    Event,
    decode_stored_event,
    now_ms,
)

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    1.5, 2.0,  # a model's quick answer: a P99 of 1.2 s read 2.4 s interpolated up to 2.5
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,  # agents that think for minutes: a P99 past 5 min is seen
)  # fmt: skip


class FlowMetrics(Collector):
    """The counters and histograms of one replica, and the fold that feeds them.

    Every counter series whose labels can be known before its first event is there at 0 as
    soon as they are: one that first appears at 1 looks to ``rate()`` like one always 1, its
    first increase lost. Closed label sets are created at once; a topic's on an agent's card
    (``topics``) or of a configured workflow (``workflows``) by the first collection that
    finds it, its latency and execution histograms included (92 series a topic).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        known_topic: Callable[[str], bool],
        *,
        topics: Callable[[], Iterable[str]] = tuple,
        workflows: Callable[[], Iterable[str]] = tuple,
        names: Names | None = None,
        topic_labels: int = 500,
    ) -> None:
        self._labels = TopicLabels(known_topic, topic_labels)
        self._topics, self._workflows = topics, workflows
        self._primed: set[tuple[str, str]] = {("topic", OTHER_TOPIC)}
        self.last_stored_ms = 0
        self.behind = 0  # events the consumer still holds after the last one taken
        self._ends, self.routes, self._handed = Ends(), Routes(names or Names()), Redeliveries()
        # Each series' child, found once: labels() costs 1.5 µs a call (series stay valid).
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}
        # The metrics live in a registry of their own, collected through this one, so that
        # each collection can first create the series of topics that became known.
        r = self._own = CollectorRegistry()
        self.finished = Counter(
            "reach_tasks_finished",
            "Tasks that reached a final state, by outcome (completed, or the dead-letter reason).",
            ["topic", "priority", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "reach_latency_seconds",
            "Reach latency: the broker's receipt of the task to its completed event.",
            ["topic", "priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.execution = Histogram(
            "reach_execution_seconds",
            "Time inside the agent's handler, as the agent reported it.",
            ["topic"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ack_latency = Histogram(
            "reach_ack_latency_seconds",
            "Dispatch to the agent's acknowledgement (time queued at the agent).",
            ["priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.dispatches = Counter(
            "reach_dispatches",
            "Tasks sent to an agent's queue, retries included.",
            ["topic", "priority"],
            registry=r,
        )
        self.retries = Counter(
            "reach_retries",
            "Dispatches that are retries or reassignments (attempt > 1).",
            ["topic", "priority"],
            registry=r,
        )
        self.attempts_failed = Counter(
            "reach_attempts_failed",
            "Attempts an agent reported as failed.",
            ["topic", "retryable"],
            registry=r,
        )
        self.dead_letters = Counter(
            "reach_dead_letters",
            "Messages written to REACH_DLQ, by reason.",
            ["reason", "topic"],
            registry=r,
        )
        self.rejections = Counter(
            "reach_rejections",
            "Tasks refused by protection: backpressure, rate limits, quotas, open breakers.",
            ["kind", "topic"],
            registry=r,
        )
        self.alerts = Counter(
            "reach_alerts",
            "Alert events the coordinator raised, by problem (see docs/metrics.md).",
            ["problem"],
            registry=r,
        )
        self.late_results = Counter(
            "reach_late_results",
            "Results fenced off because the task was reassigned meanwhile.",
            ["topic"],
            registry=r,
        )
        self.agent_transitions = Counter(
            "reach_agent_transitions",
            "Liveness transitions; a high OFFLINE rate means agents flap.",
            ["state"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "reach_breaker_transitions",
            "Circuit breaker (scope intent) and isolation (scope agent) transitions.",
            ["scope", "to"],
            registry=r,
        )
        self.workflows_started = Counter(
            "reach_workflows_started", "Workflow instances started.", ["workflow"], registry=r
        )
        self.workflows_finished = Counter(
            "reach_workflows_finished",
            "Workflow instances ended, by status.",
            ["workflow", "status"],
            registry=r,
        )
        self.workflow_duration = Histogram(
            "reach_workflow_duration_seconds",
            "Start to end of a workflow instance.",
            ["workflow", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.folded = Counter(
            "reach_events_folded", "Events counted by this replica.", ["event"], registry=r
        )
        self.received = Counter(
            "reach_tasks_received",
            "Tasks taken in from reach.task.<topic> (first delivery, decoded).",
            ["topic", "priority"],
            registry=r,
        )
        self.intake_lag = Histogram(
            "reach_intake_lag_seconds",
            "How long a task waited in REACH_TASKS before a coordinator looked at it.",
            ["priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.feed_lag = Gauge(
            "reach_metrics_feed_lag_seconds",
            "How far the counters are behind REACH_EVENTS (0 while caught up).",
            registry=r,
        )
        self.feed_lag.set_function(self._lag_s)
        self._prime_closed_sets()
        self._prime_topic(OTHER_TOPIC)
        registry.register(self)

    # -- series at 0 ---------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        """The families, for the registry's check of duplicate names."""
        return self._own.collect()

    def collect(self) -> Iterable[Metric]:
        """Every series, after creating at 0 those of topics and workflows new since the
        last collection (a card registered meanwhile)."""
        self.prime()
        return self._own.collect()

    def prime(self) -> None:
        """Create at 0 the series of every topic and workflow known now (once each)."""
        workflows = list(self._workflows())
        for topic in workflows:  # configured by the operator: never `_other`
            self._labels.admit(topic, bounded=False)
            self._prime_topic_once(topic)
        for topic in self._topics():
            if ("topic", topic) not in self._primed and self._labels.admit(topic):
                self._prime_topic_once(topic)
        for workflow in workflows:
            if ("workflow", workflow) not in self._primed:
                self._primed.add(("workflow", workflow))
                self._prime_workflow(workflow)

    def _prime_topic_once(self, topic: str) -> None:
        if ("topic", topic) not in self._primed:
            self._primed.add(("topic", topic))
            self._prime_topic(topic)

    def _prime_closed_sets(self) -> None:
        for priority in PRIORITIES:
            self._child(self.ack_latency, priority)
            self._child(self.intake_lag, priority)
        for problem in (*ALERT_PROBLEMS, OTHER_PROBLEM):
            self._child(self.alerts, problem)
        for state in TRANSITIONS:
            self._child(self.agent_transitions, state)
        for scope_to in dict.fromkeys(BREAKER_EVENTS.values()):
            self._child(self.breaker_transitions, *scope_to)
        for kind in FOLDED:
            self._child(self.folded, kind)

    def _prime_topic(self, topic: str) -> None:
        for priority in PRIORITIES:
            for outcome in ("completed", *DEAD_LETTER_REASONS):
                self._child(self.finished, topic, priority, outcome)
            for metric in (self.dispatches, self.retries, self.received):
                self._child(metric, topic, priority)
        for reason in DEAD_LETTER_REASONS:
            self._child(self.dead_letters, reason, topic)
        for kind in (*REJECTIONS, QUOTA):
            self._child(self.rejections, kind, topic)
        for retryable in ("true", "false"):
            self._child(self.attempts_failed, topic, retryable)
        self._child(self.late_results, topic)
        # The histograms too: completions before a series' first scrape are lost to rate(),
        # a whole burst of a new topic's (the P99 alert read 24 ms while tasks took 8 s).
        for priority in PRIORITIES:
            self._child(self.latency, topic, priority)
        self._child(self.execution, topic)

    def _prime_workflow(self, workflow: str) -> None:
        self._child(self.workflows_started, workflow)
        for status in WORKFLOW_STATUSES:
            self._child(self.workflows_finished, workflow, status)

    def _child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """``metric.labels(*values)``, remembered."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def topic(self, topic: str) -> str:
        """The topic as a label (see :class:`TopicLabels`)."""
        return self._labels.of(topic)

    # -- the fold ------------------------------------------------------------------------
    def count(self, msg: Delivery) -> None:
        """The ``coordinator-metrics`` consumer's fold: count one event."""
        stored_ms = msg.timestamp_ms
        self.last_stored_ms, self.behind = stored_ms, msg.pending
        if self._handed.again(msg.stream_seq, stored_ms):
            return  # a server killed -9 hands out its last moments again
        try:
            event = decode_stored_event(msg.data, msg.headers)
        except DecodeError:
            return  # not an event of ours: nothing to count
        if (counted := self.routes.vouched(msg.subject, event)) is not None:  # no forgery
            self.fold(counted, stored_ms)

    def fold(self, event: Event, stored_ms: int) -> None:
        """Count ``event``, stored by the broker at ``stored_ms``."""
        kind, detail = event.event, event.detail
        self._child(self.folded, kind).inc()
        topic, priority = self.topic(event.topic), event.priority
        match kind:
            case "routed":
                self._child(self.dispatches, topic, priority).inc()
                if event.attempt > 1:
                    self._child(self.retries, topic, priority).inc()
            case "accepted":
                if dispatched := _number(detail.get("dispatched_at_ms")):
                    acked_s = _seconds(stored_ms - dispatched)
                    self._child(self.ack_latency, priority).observe(acked_s)
            case "completed":
                self._completed(event, topic, stored_ms)
                if (duration := _number(detail.get("duration_ms"))) is not None:
                    self._child(self.execution, topic).observe(duration / 1000)
            case "failed":
                error = detail.get("error")
                retryable = not (isinstance(error, dict) and error.get("retryable") is False)
                self._child(self.attempts_failed, topic, str(retryable).lower()).inc()
            case "dead_lettered":
                self._dead_lettered(event, topic)
            case "late_result_rejected":
                self._child(self.late_results, topic).inc()
            case "rejected" | "signal_ignored" | "cancel_refused":
                self._rejected(event, topic)
            case "alert":
                problem = str(detail.get("problem"))
                label = problem if problem in ALERT_PROBLEMS else OTHER_PROBLEM
                self._child(self.alerts, label).inc()
            case "agent_state" if detail.get("state") != detail.get("was"):  # not a new reason
                self._child(self.agent_transitions, transition_label(detail)).inc()
            case "workflow_started":
                self._child(self.workflows_started, topic).inc()
            case _ if kind in BREAKER_EVENTS:
                self._child(self.breaker_transitions, *BREAKER_EVENTS[kind]).inc()
            case _ if kind in WORKFLOW_ENDS:
                self._workflow_ended(event, topic, stored_ms)

    def _completed(self, event: Event, topic: str, stored_ms: int) -> None:
        if not self._ends.first(event.trace_id, event.message_id):
            return
        self._child(self.finished, topic, event.priority, "completed").inc()
        if event.received_ms:  # 0: an event from an agent that does not carry it
            self._child(self.latency, topic, event.priority).observe(
                _seconds(stored_ms - event.received_ms)
            )

    def _dead_lettered(self, event: Event, topic: str) -> None:
        if not self._ends.first(event.trace_id, event.message_id):
            return
        reason = str(event.detail.get("reason", "unknown"))
        # A step's failure its workflow absorbed (a fan-out branch past its `partial`
        # timeout) or ended with a letter of its own: the workflow's ending is the one that
        # counts as finished; counting the step too paged on a fan-out working as designed.
        if not event.detail.get("handled"):
            self._child(self.finished, topic, event.priority, reason).inc()
        self._child(self.dead_letters, reason, topic).inc()
        self._rejected(event, topic)

    def _rejected(self, event: Event, topic: str) -> None:
        if (kind := rejection_kind(event)) is not None:
            self._child(self.rejections, kind, topic).inc()

    def _workflow_ended(self, event: Event, topic: str, stored_ms: int) -> None:
        status = event.event.removeprefix("workflow_")
        self._child(self.workflows_finished, topic, status).inc()
        if (duration := _number(event.detail.get("duration_ms"))) is not None:
            self._child(self.workflow_duration, topic, status).observe(duration / 1000)
        if status == "completed":
            # The workflow's own task completed (a failed one is dead-lettered, and counted so).
            self._completed(event, topic, stored_ms)

    # -- counted in intake ---------------------------------------------------------------
    def taken_in(self, topic: str, priority: str, stored_ms: int) -> None:
        """A task decoded in intake on its first delivery, stored at ``stored_ms``."""
        self._child(self.received, self.topic(topic), priority).inc()
        self._child(self.intake_lag, priority).observe(_seconds(now_ms() - stored_ms))

    def caught_up(self) -> None:
        """A fetch found nothing: other replicas took what was left (a false alert, before)."""
        self.behind = 0

    def _lag_s(self) -> float:
        return _seconds(now_ms() - self.last_stored_ms) if self.behind else 0.0


def _seconds(ms: float) -> float:
    return max(0.0, ms / 1000)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
