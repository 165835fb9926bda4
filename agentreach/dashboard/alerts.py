"""The alert rules of ``deploy/prometheus/alerts.yml`` for the five metrics, as the dashboard
judges them over its own history: the same thresholds, ``for`` and guards, step by step like
Prometheus evaluates them. Prometheus stays the only thing that pages;
``tests/dashboard/test_alerts.py`` reads alerts.yml to keep the two in step.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from agentreach.dashboard.history import LABELS, shown


@dataclass(frozen=True)
class Rule:
    """One alert of alerts.yml: ``metric op value`` held for ``for_s``. ``min_completed``
    is the P99 rule's guard, on the period and on the one before it is compared with: fewer
    completions are only the slowest few."""

    alert: str
    severity: str
    op: str
    value: float
    for_s: int
    min_completed: int = 0

    def compares(self, value: float) -> bool:
        """Whether ``value`` is past the threshold, as the rule's ``op`` says."""
        return _OPS[self.op](value, self.value)

    def holds(self, key: str, values: dict[str, Any]) -> bool:
        """Whether the rule's expression has a value (its condition holds) at this step."""
        value = values[key]
        if value is None:
            return False
        if key == "p99_latency":  # against the period before, as a factor
            previous = values["previous"]
            enough = min(values["period_completed"], values["before_completed"])
            if not previous or enough < self.min_completed:
                return False
            value = value / previous
        return self.compares(value)

    def threshold(self, key: str) -> dict[str, Any]:
        """The ``threshold`` of a snapshot's series."""
        return {
            "op": self.op,
            "value": self.value,
            "for_s": self.for_s,
            "text": self.text(key),
            "min_completed": self.min_completed,
        }

    def text(self, key: str) -> str:
        """Ready to show: ``"< 99.5 % for 2 min"``."""
        held = f"for {self.for_s / 60:g} min" if self.for_s else "at once"
        if key == "p99_latency":
            return (
                f"{self.op} {self.value:g} x the period before, {held},"
                f" of ≥ {self.min_completed} completions in each"
            )
        if LABELS[key][1] != "ratio":
            return f"{self.op} {self.value:g}, {held}"
        of = " of capacity" if key == "queue_fill" else ""
        return f"{self.op} {self.value * 100:g} %{of} {held}"


_OPS = {"<": operator.lt, ">": operator.gt, ">=": operator.ge}

RULES = {
    "success_rate": Rule("ReachSuccessRateLow", "critical", "<", 0.995, 120),
    "p99_latency": Rule("ReachLatencyP99Up", "warning", ">", 1.3, 300, min_completed=100),
    "queue_fill": Rule("ReachQueueDepthHigh", "warning", ">=", 0.5, 180),
    "retry_rate": Rule("ReachRetryRateHigh", "warning", ">", 0.05, 120),
    "isolated_agents": Rule("ReachAgentsIsolated", "critical", ">", 0, 0),
}


def judge(key: str, rows: list[tuple[int, dict[str, Any]]]) -> tuple[str, int | None]:
    """ok, pending, firing or no_data, as the rule would say at the last of these steps
    (:meth:`History.rows`); and since when its condition holds (pending from)."""
    rule = RULES[key]
    if not rows or rows[-1][1][key] is None:
        return "no_data", None
    if key == "queue_fill" and rows[-1][1].get("queues_over") is not None:
        held_from = _each_queue_held_from(rows)
    else:
        held_from = None
        for t, values in reversed(rows):
            if not rule.holds(key, values):
                break
            held_from = t
    if held_from is None:
        return "ok", None
    held_s = (rows[-1][0] - held_from) / 1000
    return ("firing" if held_s >= rule.for_s else "pending"), held_from


def _each_queue_held_from(rows: list[tuple[int, dict[str, Any]]]) -> int | None:
    """Since when the queue over the threshold longest without a break has been over it:
    Prometheus judges each queue (agent and priority) on its own, so two queues taking
    turns above it fire nothing."""
    held_from: int | None = None
    still = set(rows[-1][1]["queues_over"])
    for t, values in reversed(rows):
        still &= values.get("queues_over") or frozenset()
        if not still:
            break
        held_from = t
    return held_from


def firing(series: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The snapshot's ``alerts``: one per series whose rule fires, since it fires (its
    condition held from ``since_ms``, plus ``for``)."""
    found = []
    for key, entry in series.items():
        if entry["state"] != "firing":
            continue
        rule = RULES[key]
        value = shown(key, entry["value"])
        if key == "p99_latency" and entry["previous"]:
            # The rule compares hours: on the dashboard's shorter periods Prometheus may not agree.
            value += f", {entry['value'] / entry['previous']:.2f} x the period before"
            value += " (the dashboard's periods; Prometheus's rule compares hours)"
        found.append(
            {
                "name": rule.alert,
                "metric": key,
                "severity": rule.severity,
                "since_ms": entry["since_ms"] + rule.for_s * 1000,
                "summary": f"{entry['label']}: {value} ({rule.text(key)})",
            }
        )
    return found
