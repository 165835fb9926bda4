"""The five metrics over time, folded from ``REACH_EVENTS`` by the dashboard itself.

The dashboard does not read one coordinator's counters: with two replicas each counts
half. It follows every event of the kinds that matter (from a window back), keeps them in
buckets of ``step_s``, and computes the five metrics with the definitions of the alert
rules: success = completed ÷ finished (except ``invalid_envelope``, and ``no_route`` of a topic
nobody serves: a sender's mistakes) over 5 minutes, P99 of
intake → completed over a period against the period before, the fullest queue against its
capacity, retries ÷ dispatches over 5 minutes, isolated agents now.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from agentreach.coordinator.observability.flow import LATENCY_BUCKETS
from agentreach.envelopes import Event

RATE_WINDOW_MS = 300_000  # the rules' [5m]
SAMPLE_AGE_MS = 5_000  # gauges are sampled every 2 s; older than this, they are not known
KEYS = ("success_rate", "p99_latency", "queue_fill", "retry_rate", "isolated_agents")


@dataclass
class Bucket:
    completed: int = 0
    finished: int = 0  # completed or dead-lettered, except what the rules leave out
    dispatches: int = 0
    retries: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    queue_fill: float | None = None  # sampled from the views, not folded
    queues_over: frozenset[str] | None = None  # the queues above the alert's threshold then
    isolated: int | None = None


LABELS = {
    "success_rate": ("Success rate", "ratio"),
    "p99_latency": ("P99 reach latency", "seconds"),
    "queue_fill": ("Queue depth", "ratio"),
    "retry_rate": ("Retry rate", "ratio"),
    "isolated_agents": ("Isolated agents", "count"),
}


class History:
    """Buckets of ``step_s`` covering ``window_s`` of charts plus what the windows need."""

    def __init__(self, *, step_s: float = 10.0, window_s: float = 1800.0, period_s: float = 600.0):
        self.step_ms = int(step_s * 1000)
        self.window_ms = int(window_s * 1000)
        self.period_ms = int(period_s * 1000)
        self._buckets: dict[int, Bucket] = {}

    @property
    def since_ms_back(self) -> int:
        """How far back the fold must start to fill every window at once."""
        return self.window_ms + max(RATE_WINDOW_MS, 2 * self.period_ms)

    def _bucket(self, at_ms: float) -> Bucket:
        return self._buckets.setdefault(int(at_ms // self.step_ms), Bucket())

    def fold(
        self, event: Event, stored_ms: int, *, served: Callable[[str], bool] = lambda _: True
    ) -> None:
        """Count ``event``; ``served`` says whether an agent or a workflow serves a topic."""
        kind = event.event
        if kind == "routed":
            bucket = self._bucket(stored_ms)
            bucket.dispatches += 1
            bucket.retries += event.attempt > 1
        elif kind in ("completed", "workflow_completed"):
            bucket = self._bucket(stored_ms)
            bucket.completed += 1
            bucket.finished += 1
            if event.received_ms:
                bucket.latency[_index((stored_ms - event.received_ms) / 1000)] += 1
        elif kind == "dead_lettered" and not _left_out(event, served):
            self._bucket(stored_ms).finished += 1

    def sample(
        self,
        now_ms: int,
        *,
        queue_fill: float | None,
        isolated: int,
        queues_over: Collection[str] | None = None,
    ) -> None:
        """The gauges now: the fullest queue's fill, the isolated agents, and which queues
        are above the alert's threshold (each is judged on its own, as Prometheus does)."""
        bucket = self._bucket(now_ms)
        bucket.queue_fill, bucket.isolated = queue_fill, isolated
        bucket.queues_over = None if queues_over is None else frozenset(queues_over)
        oldest = (now_ms - self.since_ms_back) // self.step_ms
        for key in [k for k in self._buckets if k < oldest]:
            del self._buckets[key]

    # -- reading -------------------------------------------------------------------------
    def _range(self, start_ms: float, end_ms: float) -> list[Bucket]:
        first, last = int(start_ms // self.step_ms) + 1, int(end_ms // self.step_ms)
        return [b for k, b in self._buckets.items() if first <= k <= last]

    def values(self, at_ms: int) -> dict[str, Any]:
        """The five metrics as they were at ``at_ms``, with what the alerts and the details
        need: the previous P99, the counts of 5 min, the completions of both P99 periods."""
        recent = self._range(at_ms - RATE_WINDOW_MS, at_ms)
        completed = sum(b.completed for b in recent)
        finished = sum(b.finished for b in recent)
        retries = sum(b.retries for b in recent)
        dispatches = sum(b.dispatches for b in recent)
        period = self._range(at_ms - self.period_ms, at_ms)
        before = self._range(at_ms - 2 * self.period_ms, at_ms - self.period_ms)
        latest = self._sampled_at(at_ms)
        return {
            "success_rate": completed / finished if finished else None,
            "p99_latency": _p99(period),
            "previous": _p99(before),
            "queue_fill": latest.queue_fill,
            "queues_over": latest.queues_over,
            "retry_rate": retries / dispatches if dispatches else None,
            "isolated_agents": latest.isolated,
            "completed": completed,
            "finished": finished,
            "retries": retries,
            "dispatches": dispatches,
            "period_completed": sum(sum(b.latency) for b in period),
            "before_completed": sum(sum(b.latency) for b in before),
        }

    def _sampled_at(self, at_ms: int) -> Bucket:
        """The latest bucket with a sample of the gauges, at most ``SAMPLE_AGE_MS`` old."""
        key = int(at_ms // self.step_ms)
        for back in range(max(1, SAMPLE_AGE_MS // self.step_ms) + 1):
            bucket = self._buckets.get(key - back)
            if bucket is not None and bucket.isolated is not None:
                return bucket
        return Bucket()

    def rows(self, now_ms: int) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`values` at every step of the chart window, oldest first."""
        end = (now_ms // self.step_ms) * self.step_ms
        times = range(end - self.window_ms + self.step_ms, end + 1, self.step_ms)
        return [(t, self.values(t)) for t in times]

    def points(self, now_ms: int) -> dict[str, list[list[float | None]]]:
        """Each metric at every step of the chart window, oldest first."""
        return chart(self.rows(now_ms))


def chart(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, list[list[float | None]]]:
    """The points of each metric, from :meth:`History.rows`."""
    return {key: [[t, v[key]] for t, v in rows] for key in KEYS}


def _p99(buckets: list[Bucket]) -> float | None:
    counts = [0] * (len(LATENCY_BUCKETS) + 1)
    for bucket in buckets:
        counts = [a + b for a, b in zip(counts, bucket.latency, strict=True)]
    return quantile(0.99, counts)


def shown(key: str, value: float | None) -> str:
    """``value`` of metric ``key`` as the page and ``reach top`` show it: ``58.0 %``."""
    if value is None:
        return "—"
    unit = LABELS[key][1]
    if unit == "ratio":
        return f"{value * 100:.{2 if key == 'success_rate' else 1}f} %"
    if unit == "seconds":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return str(round(value))


def quantile(q: float, counts: list[int]) -> float | None:
    """Like PromQL's histogram_quantile over these bucket counts (linear within a bucket)."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, count in enumerate(counts):
        if seen + count >= rank and count:
            if i == len(LATENCY_BUCKETS):
                return LATENCY_BUCKETS[-1]
            lower = LATENCY_BUCKETS[i - 1] if i else 0.0
            return lower + (LATENCY_BUCKETS[i] - lower) * (rank - seen) / count
        seen += count
    return LATENCY_BUCKETS[-1]


def _index(seconds: float) -> int:
    for i, bound in enumerate(LATENCY_BUCKETS):
        if seconds <= bound:
            return i
    return len(LATENCY_BUCKETS)


def _left_out(letter: Event, served: Callable[[str], bool]) -> bool:
    """A letter the rules leave out of the finished tasks: a sender's mistake (a malformed
    task, one to a topic nobody serves), or a step its workflow accounts for (the
    workflow's own ending counts)."""
    reason = letter.detail.get("reason")
    if letter.detail.get("handled"):
        return True
    return reason == "invalid_envelope" or (reason == "no_route" and not served(letter.topic))
