"""Series at 0: every flow series whose labels can be known before its first event.

A counter series that first appears at 1 looks to ``rate()`` like one always 1, its first
increase lost. Closed label sets are created at once; a topic's on an agent's card (``topics``)
or of a configured workflow (``workflows``) by the first collection that finds it, its latency
and execution histograms included (92 series a topic); and a dead-letter reason a routing rule
names (``to: {dlq: maintenance}``), for each primed topic the rule's glob takes, by the first
collection after the rules that name it were loaded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from agentreach.coordinator.observability.families import FlowFamilies
from agentreach.coordinator.observability.labels import (
    ALERT_PROBLEMS,
    BREAKER_EVENTS,
    FOLDED,
    OTHER_PROBLEM,
    OTHER_TOPIC,
    QUOTA,
    REJECTIONS,
    TRANSITIONS,
    WORKFLOW_STATUSES,
    TopicLabels,
)
from agentreach.coordinator.routing.rules import topic_matcher
from agentreach.envelopes import DEAD_LETTER_REASONS, PRIORITIES

Key = tuple[MetricWrapperBase, tuple[str, ...]]
# How long a new series' counts wait for a collection to show it at 0 first (no scraper
# at all: they are counted directly after this).
UNSEEN_FOR_AT_MOST_S = 60.0


class Children:
    """``metric.labels(*values)``, remembered: labels() costs 1.5 µs a call, and a series
    once made stays valid.

    A series no collection has shown yet is made at 0, and what is counted on it waits for
    the collection after the one that shows it: one born at 70 read to ``rate()`` as one
    always 70 (a trial: a new topic's first burst, 70 dead letters in 100, left the
    success ratio at 1). Call :meth:`collecting` around each collection."""

    def __init__(self) -> None:
        self._known: dict[Key, Any] = {}
        self._unseen: dict[Key, float] = {}  # made since the last collection: when
        self._waiting: dict[Key, _Waiting] = {}

    def __call__(self, metric: MetricWrapperBase, *values: str) -> Any:
        key = (metric, values)
        child = self._known.get(key)
        if child is None:
            child = self._known[key] = metric.labels(*values)
            self._unseen[key] = time.monotonic()
        if key not in self._unseen:
            return child
        if time.monotonic() - self._unseen[key] > UNSEEN_FOR_AT_MOST_S:
            del self._unseen[key]
            self._apply(key)
            return child
        return self._waiting.setdefault(key, _Waiting())

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Around a collection: what waited on series shown by an earlier one is counted
        before it; every series made by now has been shown after it."""
        for key in [k for k in self._waiting if k not in self._unseen]:
            self._apply(key)
        yield
        self._unseen.clear()

    def _apply(self, key: Key) -> None:
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            waiting.apply_to(self._known[key])


class _Waiting:
    """What was counted on a series not shown yet: an increase, observations."""

    def __init__(self) -> None:
        self.increase = 0.0
        self.observed: list[float] = []

    def inc(self, amount: float = 1) -> None:
        self.increase += amount

    def observe(self, value: float) -> None:
        self.observed.append(value)

    def apply_to(self, child: Any) -> None:
        if self.increase:
            child.inc(self.increase)
        for value in self.observed:
            child.observe(value)


class Priming:
    """Creates the series of ``families`` at 0, each once; call it before each collection."""

    def __init__(
        self,
        families: FlowFamilies,
        child: Children,
        labels: TopicLabels,
        *,
        topics: Callable[[], Iterable[str]] = tuple,
        workflows: Callable[[], Iterable[str]] = tuple,
        rule_reasons: Callable[[], Iterable[tuple[str, str]]] = tuple,
    ) -> None:
        self._f, self._child, self._labels = families, child, labels
        self._topics, self._workflows, self._rule_reasons = topics, workflows, rule_reasons
        self._primed_topics: dict[str, None] = {}  # in order, for the rules' globs
        self._primed_workflows: set[str] = set()
        self._primed_reasons: set[tuple[str, str]] = set()
        self._reasons_seen: tuple[tuple[tuple[str, str], ...], int] = ((), 0)
        self._closed_sets()
        self._topic_once(OTHER_TOPIC)

    def __call__(self) -> None:
        """Create at 0 the series of every topic, workflow and rule reason known now."""
        workflows = list(self._workflows())
        for topic in workflows:  # configured by the operator: never `_other`
            self._labels.admit(topic, bounded=False)
            self._topic_once(topic)
        for topic in self._topics():
            if topic not in self._primed_topics and self._labels.admit(topic):
                self._topic_once(topic)
        for workflow in workflows:
            if workflow not in self._primed_workflows:
                self._primed_workflows.add(workflow)
                self._workflow(workflow)
        self._reasons()

    def _closed_sets(self) -> None:
        f = self._f
        for priority in PRIORITIES:
            self._child(f.ack_latency, priority)
            self._child(f.intake_lag, priority)
        for problem in (*ALERT_PROBLEMS, OTHER_PROBLEM):
            self._child(f.alerts, problem)
        for state in TRANSITIONS:
            self._child(f.agent_transitions, state)
        for scope_to in dict.fromkeys(BREAKER_EVENTS.values()):
            self._child(f.breaker_transitions, *scope_to)
        for kind in FOLDED:
            self._child(f.folded, kind)

    def _topic_once(self, topic: str) -> None:
        if topic not in self._primed_topics:
            self._primed_topics[topic] = None
            self._topic(topic)

    def _topic(self, topic: str) -> None:
        f = self._f
        for priority in PRIORITIES:
            for outcome in ("completed", *DEAD_LETTER_REASONS):
                self._child(f.finished, topic, priority, outcome)
            for metric in (f.dispatches, f.retries, f.received):
                self._child(metric, topic, priority)
        for reason in DEAD_LETTER_REASONS:
            self._child(f.dead_letters, reason, topic)
        for kind in (*REJECTIONS, QUOTA):
            self._child(f.rejections, kind, topic)
        for retryable in ("true", "false"):
            self._child(f.attempts_failed, topic, retryable)
        self._child(f.late_results, topic)
        # The histograms too: completions before a series' first scrape are lost to rate(),
        # a whole burst of a new topic's (the P99 alert read 24 ms while tasks took 8 s).
        for priority in PRIORITIES:
            self._child(f.latency, topic, priority)
        self._child(f.execution, topic)

    def _workflow(self, workflow: str) -> None:
        self._child(self._f.workflows_started, workflow)
        for status in WORKFLOW_STATUSES:
            self._child(self._f.workflows_finished, workflow, status)

    def _reasons(self) -> None:
        """The rules' own reasons, on each primed topic their glob takes, and on ``_other``
        (where the tasks of a topic nobody serves are counted)."""
        reasons = tuple(
            (glob, r) for glob, r in self._rule_reasons() if r not in DEAD_LETTER_REASONS
        )
        seen = (reasons, len(self._primed_topics))
        if seen == self._reasons_seen:
            return  # nothing new since the last collection: skip walking the topics again
        self._reasons_seen = seen
        for glob, reason in reasons:
            takes = topic_matcher(glob)
            for topic in self._primed_topics:
                if topic == OTHER_TOPIC or takes(topic):
                    self._reason(topic, reason)

    def _reason(self, topic: str, reason: str) -> None:
        if (topic, reason) in self._primed_reasons:
            return
        self._primed_reasons.add((topic, reason))
        for priority in PRIORITIES:
            self._child(self._f.finished, topic, priority, reason)
        self._child(self._f.dead_letters, reason, topic)
