"""The label values of the flow metrics that are known before any event: the closed sets
(rejection kinds, alert problems, event kinds...; the outcomes are the dead-letter reasons of
``envelopes.DEAD_LETTER_REASONS``) that the series are created with at 0, and the label of a
topic nobody serves."""

from __future__ import annotations

from typing import get_args

from agentreach.envelopes import Event, LivenessState

OTHER_TOPIC = "_other"  # topics nobody serves: anyone may publish to reach.task.<anything>
WORKFLOW_STATUSES = ("completed", "failed", "cancelled")
REJECTIONS = ("backpressure", "rate_limited", "circuit_open")
QUOTA = "quota"  # the rejection kind of a caller over its quota: `rejected`, no dead letter
ALERT_PROBLEMS = (
    "impersonation",
    "unresponsive",
    "intent_not_allowed",
    "ended_twice",
    "unreported",
)
OTHER_PROBLEM = "other"
# A transition's state; a clean stop's OFFLINE is STOPPED: a rolling deploy is no flapping.
TRANSITIONS = (*get_args(LivenessState), "STOPPED")
BREAKER_EVENTS = {
    "breaker_opened": ("intent", "open"),
    "breaker_half_open": ("intent", "half_open"),
    "breaker_closed": ("intent", "closed"),
    "agent_isolated": ("agent", "open"),
    "isolation_trial": ("agent", "half_open"),
    "agent_restored": ("agent", "closed"),
}
WORKFLOW_ENDS = {"workflow_completed", "workflow_failed", "workflow_cancelled"}
# What the fold is handed: progress, the bulkiest kind, is not among them.
FOLDED = (
    "routed",
    "accepted",
    "completed",
    "failed",
    "dead_lettered",
    "late_result_rejected",
    "rejected",
    "alert",
    "agent_state",
    *BREAKER_EVENTS,
    "workflow_started",
    *sorted(WORKFLOW_ENDS),
)


def rejection_kind(event: Event) -> str | None:
    """The kind ``event`` counts as in ``reach_rejections_total``, if any: a ``rejected``
    event (``quota`` for a caller over its quota), or a ``rejected`` dead letter of one of the
    :data:`REJECTIONS`. Not a quota refusal's letter (one nobody would have heard of else):
    its ``rejected`` event counted it already; it is the only ``rate_limited`` letter with a
    ``retry_after_ms``."""
    error = event.detail.get("error")
    error = error if isinstance(error, dict) else {}
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    if event.event == "rejected":
        return QUOTA if "quota" in event.detail else kind if kind in REJECTIONS else None
    if event.event != "dead_lettered" or event.detail.get("reason") != "rejected":
        return None
    quota_letter = kind == "rate_limited" and error.get("retry_after_ms") is not None
    return kind if kind in REJECTIONS and not quota_letter else None


def transition_label(detail: dict[str, object]) -> str:
    """The ``state`` label of an ``agent_state`` event's transition."""
    state = str(detail.get("state", "UNKNOWN"))
    return "STOPPED" if state == "OFFLINE" and detail.get("reason") == "stopped" else state
