"""The families of the flow metrics: what each counter and histogram is and its labels.

They live in a registry of their own, collected through the coordinator's, so that each
collection can first create the series of topics that became known (see :mod:`.priming`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    1.5, 2.0,  # a model's quick answer: a P99 of 1.2 s read 2.4 s interpolated up to 2.5
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 900.0, 1200.0,  # a P99 of ~650 s read ~1,500 s with 1,800 next to 600
    1800.0, 3600.0,  # agents that think for minutes: a P99 past 5 min is seen
)  # fmt: skip


class FlowFamilies:
    """Every family the flow metrics export, on a registry of their own (``registry``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
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
