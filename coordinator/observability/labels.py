"""The label values of the flow metrics that are known before any event: the closed sets
(rejection kinds, alert problems, event kinds...; the outcomes are the dead-letter reasons of
``envelopes.DEAD_LETTER_REASONS``) that the series are created with at 0, and the label of a
topic nobody serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, get_args

from agentreach.envelopes import Event, LivenessState
from agentreach.logs import RepeatedLines, get_logger

if TYPE_CHECKING:
    from agentreach.coordinator.routing.directory import AgentDirectory

log = get_logger("coordinator.metrics")

OTHER_TOPIC = "_other"  # topics nobody serves: anyone may publish to reach.task.<anything>
TOPICS_PER_AGENT = 32  # of a card's intents, the first by name that may be labels
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
# A caller's signal or cancel over its quota is answered in one of these.
QUOTA_ANSWERS = ("signal_ignored", "cancel_refused")
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
    *QUOTA_ANSWERS,
    "alert",
    "agent_state",
    *BREAKER_EVENTS,
    "workflow_started",
    *sorted(WORKFLOW_ENDS),
)


def rejection_kind(event: Event) -> str | None:
    """The kind ``event`` counts as in ``reach_rejections_total``, if any: a ``rejected``
    event (``quota`` for a caller over its quota; so is a signal or cancel refused for it,
    said in a :data:`QUOTA_ANSWERS` event), or a ``rejected`` dead letter of one of the
    :data:`REJECTIONS`. Not the letter of a refusal over a quota or a topic's rate (one
    nobody would have heard of else): its ``rejected`` event counted it already; those are
    the ``rate_limited`` letters with a ``retry_after_ms``."""
    error = event.detail.get("error")
    error = error if isinstance(error, dict) else {}
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    if event.event == "rejected":
        return QUOTA if "quota" in event.detail else kind if kind in REJECTIONS else None
    if event.event in QUOTA_ANSWERS:  # a caller's signal or cancel, refused for its quota
        return QUOTA if kind == "rate_limited" else None
    if event.event != "dead_lettered" or event.detail.get("reason") != "rejected":
        return None
    quota_letter = kind == "rate_limited" and error.get("retry_after_ms") is not None
    return kind if kind in REJECTIONS and not quota_letter else None


def transition_label(detail: dict[str, object]) -> str:
    """The ``state`` label of an ``agent_state`` event's transition."""
    state = str(detail.get("state", "UNKNOWN"))
    return "STOPPED" if state == "OFFLINE" and detail.get("reason") == "stopped" else state


class TopicLabels:
    """Which topics are labels of their own: only those an agent or a workflow serves (or
    served: its `no_route` once its agents are forgotten counts in the success ratio), so
    that anyone's `reach.task.<anything>` makes no series; and at most ``limit`` of the
    agents' (each costs about 190 series, never removed: an agent whose allowance is a
    pattern rewrote its card with 500 new intents at a time, 95,000 series each). The rest
    are `_other`."""

    def __init__(self, known: Callable[[str], bool], limit: int) -> None:
        self._known = known
        self._labelled = {OTHER_TOPIC}
        self._left = limit
        self._full = RepeatedLines(60.0)

    def of(self, topic: str) -> str:
        """``topic`` as a label."""
        if topic in self._labelled:
            return topic
        return topic if self._known(topic) and self.admit(topic) else OTHER_TOPIC

    def admit(self, topic: str, *, bounded: bool = True) -> bool:
        """Whether ``topic`` is a label of its own, made one if there is room (``bounded``
        False: a workflow's, which the operator configured)."""
        if topic in self._labelled:
            return True
        if bounded and self._left <= 0:
            if (unsaid := self._full.due("full")) is not None:
                said = "too many topics to label: more are counted as _other (metrics.topic_labels)"
                log.warning(said, topic=topic, more_not_said=unsaid)
            return False
        if bounded:
            self._left -= 1
        self._labelled.add(topic)
        return True


class AgentTopics:
    """The agents' topics that may be labels: at most :data:`TOPICS_PER_AGENT` of each
    agent's, taken in name order from its card, for as long as the replica runs (a label is
    never given back), so that no one agent takes the labels every agent shares: one card of
    500 intents did, and then one rewritten 17 times with 32 new intents each. Worked out
    again only when a card changed (``version``)."""

    def __init__(self, directory: AgentDirectory) -> None:
        self._directory = directory
        self._given: dict[str, set[str]] = {}  # agent id → the topics it was given
        self._shared: frozenset[str] = frozenset()
        self._shared_at = -1

    def shared(self) -> frozenset[str]:
        if self._shared_at != (version := self._directory.version):
            self._shared = frozenset(
                topic
                for agent_id, card in self._directory.cards.items()
                for topic in self._share_of(agent_id, sorted(card.intents))
            )
            self._shared_at = version
        return self._shared

    def _share_of(self, agent_id: str, topics: list[str]) -> list[str]:
        given = self._given.setdefault(agent_id, set())
        for topic in topics:
            if len(given) >= TOPICS_PER_AGENT:
                break
            given.add(topic)
        return [topic for topic in topics if topic in given]
