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

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector, Metric

from agentreach.broker import Delivery
from agentreach.broker.names import Names
from agentreach.coordinator.observability.families import LATENCY_BUCKETS, FlowFamilies
from agentreach.coordinator.observability.labels import (
    ALERT_PROBLEMS,
    BREAKER_EVENTS,
    OTHER_PROBLEM,
    WORKFLOW_ENDS,
    TopicLabels,
    rejection_kind,
    transition_label,
)
from agentreach.coordinator.observability.once import Ends, Redeliveries, Routes
from agentreach.coordinator.observability.priming import Children, Priming
from agentreach.envelopes import DecodeError, Event, decode_stored_event, now_ms

__all__ = ["LATENCY_BUCKETS", "FlowMetrics"]


class FlowMetrics(FlowFamilies, Collector):
    """The counters and histograms of one replica (its families), and the fold that feeds
    them. Their series are created at 0 as soon as their labels are known (see
    :mod:`.priming`): ``topics`` on agents' cards, configured ``workflows``, and the
    ``rule_reasons`` (topic glob, reason) of the routing rules that dead-letter."""

    def __init__(
        self,
        registry: CollectorRegistry,
        known_topic: Callable[[str], bool],
        *,
        topics: Callable[[], Iterable[str]] = tuple,
        workflows: Callable[[], Iterable[str]] = tuple,
        rule_reasons: Callable[[], Iterable[tuple[str, str]]] = tuple,
        names: Names | None = None,
        topic_labels: int = 500,
    ) -> None:
        FlowFamilies.__init__(self)
        self._labels = TopicLabels(known_topic, topic_labels)
        self.last_stored_ms = 0
        self.behind = 0  # events the consumer still holds after the last one taken
        self._ends, self.routes, self._handed = Ends(), Routes(names or Names()), Redeliveries()
        self._child = Children()
        self.prime = Priming(
            self,
            self._child,
            self._labels,
            topics=topics,
            workflows=workflows,
            rule_reasons=rule_reasons,
        )
        self.feed_lag.set_function(self._lag_s)
        registry.register(self)

    def describe(self) -> Iterable[Metric]:
        """The families, for the registry's check of duplicate names."""
        return self.registry.collect()

    def collect(self) -> Iterable[Metric]:
        """Every series, after creating at 0 those whose labels became known since the last
        collection (a card registered, rules reloaded)."""
        with self._child.collecting():
            self.prime()
            return list(self.registry.collect())

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
