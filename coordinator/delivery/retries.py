"""When and how often to try a failed task again: attempts per topic, and exponential
backoff with jitter, capped."""

from __future__ import annotations

import random

import msgspec

from agentreach.broker import Broker
from agentreach.broker.lifecycle import events_of
from agentreach.coordinator.units import Positive, PositiveSeconds
from agentreach.envelopes import AgentCard, Task

JITTER = 0.2


class RetryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How many attempts a task gets, and the waits between them (1, 2, 4 … s by default)."""

    max_attempts: Positive = 3
    attempts_by_topic: dict[str, Positive] = {}
    base_s: PositiveSeconds = 1.0
    cap_s: PositiveSeconds = 30.0

    def attempts_for(self, topic: str, intent_setting: int | None) -> int:
        """How many attempts ``topic`` gets: this config's per-topic value, else the
        intent's own setting on the agent card, else ``max_attempts``."""
        return self.attempts_by_topic.get(topic) or intent_setting or self.max_attempts

    def allowed(self, task: Task, card: AgentCard | None) -> int:
        """How many attempts ``task`` gets, with the intent setting on ``card`` (its agent's)."""
        intent = card.intents.get(task.topic) if card else None
        return self.attempts_for(task.topic, intent.max_attempts if intent else None)

    def backoff_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after attempt ``attempt`` failed."""
        return backoff_s(attempt, base_s=self.base_s, cap_s=self.cap_s, rng=rng)


def backoff_s(
    attempt: int, *, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after attempt ``attempt`` failed: base · 2^(attempt-1), ±20 %, ≤ cap."""
    exponential = base_s * 2 ** (attempt - 1)
    jitter = 1 + (rng or random).uniform(-JITTER, JITTER)
    return min(cap_s, exponential * jitter)


async def failed_before(broker: Broker, task: Task) -> str:
    """What the attempt before ``task``'s (a retry) failed with, to say beside why the retry
    is refused (every breaker open: the agent's own failures isolated it), or "" when none
    is recorded. The letter said only the refusal, the handler's error was in the trace."""
    if task.attempt <= 1:
        return ""
    events = await events_of(broker, task.trace_id, task.message_id)
    mine = [event for _, event in events.run_of(broker.names, task.caller)]
    failures = [e for e in mine if e.event == "failed" and isinstance(e.detail.get("error"), dict)]
    if not failures:
        return ""
    last = failures[-1]
    error = last.detail["error"]
    return f"; attempt {last.attempt} failed: {error.get('type')}: {error.get('message')}"
