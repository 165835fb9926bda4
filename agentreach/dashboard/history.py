"""The five metrics over time, folded from ``REACH_EVENTS`` by the dashboard itself.

The dashboard does not read one coordinator's counters: with two replicas each counts
half. It follows every event of the kinds that matter (from a window back), keeps them in
buckets of ``step_s``, and computes the five metrics with the definitions of the alert
rules: success = completed ÷ finished (except ``invalid_envelope``) over 5 minutes, P99 of
intake → completed over a period against the period before, the fullest queue against its
capacity, retries ÷ dispatches over 5 minutes, isolated agents now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentreach.coordinator.observability.flow import LATENCY_BUCKETS
from agentreach.envelopes import Event

RATE_WINDOW_MS = 300_000  # the rules' [5m]
SAMPLE_AGE_MS = 5_000  # gauges are sampled every 2 s; older than this, they are not known
KEYS = ("success_rate", "p99_latency", "queue_fill", "retry_rate", "isolated_agents")


@dataclass
class Bucket:
    completed: int = 0
    finished: int = 0  # completed or dead-lettered, except invalid_envelope
    dispatches: int = 0
    retries: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    queue_fill: float | None = None  # sampled from the views, not folded
    isolated: int | None = None


@dataclass(frozen=True)
class Threshold:
    op: str
    value: float
    for_s: int
    text: str

    def crossed(self, value: float, previous: float | None = None) -> bool:
        limit = self.value * previous if previous is not None else self.value
        return value < limit if self.op == "<" else value > limit


THRESHOLDS = {
    "success_rate": Threshold("<", 0.995, 120, "< 99.5 % for 2 min"),
    "p99_latency": Threshold(">", 1.3, 300, "> 1.3 x the period before, for 5 min"),
    "queue_fill": Threshold(">", 0.5, 180, "> 50 % of capacity for 3 min"),
    "retry_rate": Threshold(">", 0.05, 120, "> 5 % for 2 min"),
    "isolated_agents": Threshold(">", 0, 0, "> 0, at once"),
}
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

    def fold(self, event: Event, stored_ms: int) -> None:
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
        elif kind == "dead_lettered" and event.detail.get("reason") != "invalid_envelope":
            self._bucket(stored_ms).finished += 1

    def sample(self, now_ms: int, *, queue_fill: float | None, isolated: int) -> None:
        bucket = self._bucket(now_ms)
        bucket.queue_fill, bucket.isolated = queue_fill, isolated
        oldest = (now_ms - self.since_ms_back) // self.step_ms
        for key in [k for k in self._buckets if k < oldest]:
            del self._buckets[key]

    # -- reading -------------------------------------------------------------------------
    def _range(self, start_ms: float, end_ms: float) -> list[Bucket]:
        first, last = int(start_ms // self.step_ms) + 1, int(end_ms // self.step_ms)
        return [b for k, b in self._buckets.items() if first <= k <= last]

    def values(self, at_ms: int) -> dict[str, float | None]:
        """The five metrics as they were at ``at_ms`` (and the previous P99)."""
        recent = self._range(at_ms - RATE_WINDOW_MS, at_ms)
        finished = sum(b.finished for b in recent)
        dispatches = sum(b.dispatches for b in recent)
        latest = self._sampled_at(at_ms)
        return {
            "success_rate": sum(b.completed for b in recent) / finished if finished else None,
            "p99_latency": self._p99(at_ms - self.period_ms, at_ms),
            "previous": self._p99(at_ms - 2 * self.period_ms, at_ms - self.period_ms),
            "queue_fill": latest.queue_fill,
            "retry_rate": sum(b.retries for b in recent) / dispatches if dispatches else None,
            "isolated_agents": latest.isolated,
        }

    def _sampled_at(self, at_ms: int) -> Bucket:
        """The latest bucket with a sample of the gauges, at most ``SAMPLE_AGE_MS`` old."""
        key = int(at_ms // self.step_ms)
        for back in range(max(1, SAMPLE_AGE_MS // self.step_ms) + 1):
            bucket = self._buckets.get(key - back)
            if bucket is not None and bucket.isolated is not None:
                return bucket
        return Bucket()

    def _p99(self, start_ms: float, end_ms: float) -> float | None:
        counts = [0] * (len(LATENCY_BUCKETS) + 1)
        for bucket in self._range(start_ms, end_ms):
            counts = [a + b for a, b in zip(counts, bucket.latency, strict=True)]
        return quantile(0.99, counts)

    def points(self, now_ms: int) -> dict[str, list[list[float | None]]]:
        """Each metric at every step of the chart window, oldest first."""
        end = (now_ms // self.step_ms) * self.step_ms
        times = range(end - self.window_ms + self.step_ms, end + 1, self.step_ms)
        rows = [(t, self.values(t)) for t in times]
        return {key: [[t, v[key]] for t, v in rows] for key in KEYS}


def judge(
    key: str, points: list[list[float | None]], previous: float | None
) -> tuple[str, float | None]:
    """ok, pending, firing or no_data, as the alert rule would say of these points; and
    since when the threshold is crossed."""
    threshold = THRESHOLDS[key]
    if not points or points[-1][1] is None:
        return "no_data", None
    if key == "p99_latency" and previous is None:
        return "ok", None  # nothing to compare with yet
    held_from = None
    for t, value in reversed(points):
        if value is None or not threshold.crossed(
            value, previous if key == "p99_latency" else None
        ):
            break
        held_from = t
    if held_from is None:
        return "ok", None
    held_s = (points[-1][0] - held_from) / 1000  # type: ignore[operator]
    return ("firing" if held_s >= threshold.for_s else "pending"), held_from


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


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
