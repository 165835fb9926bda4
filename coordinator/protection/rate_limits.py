"""Token buckets: per topic (at intake) and per agent, as this replica enforces them; the
configuration of callers' quotas too, which every replica shares (:mod:`.quotas`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from agentreach.coordinator.units import NonNegativeSeconds
from agentreach.envelopes import AgentCard, RateLimit
from agentreach.envelopes.messages import Token

# The quota of every caller not named in ``RateLimits.callers``.
DEFAULT_CALLER = "default"


class RateLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Token buckets per topic (at intake), per agent (overriding the agent's card) and
    per caller.

    Over a topic's or an agent's limit a task waits at most ``wait_s``, then is rejected
    as ``rate_limited``; each coordinator replica keeps its own buckets of those. Callers'
    quotas (``callers``: ``default`` for everyone not named) are one bucket per caller in
    KV, shared by every replica; a task over its caller's quota is refused at once, and so is
    a workflow signal or cancel of the caller's (each takes a token too).
    """

    topics: dict[str, RateLimit] = {}
    agents: dict[str, RateLimit] = {}
    callers: dict[Token, RateLimit] = {}
    wait_s: NonNegativeSeconds = 0.1

    def caller_quota(self, caller: str) -> tuple[str, RateLimit] | None:
        """``caller``'s quota and its name there (the caller's, else ``default``); None
        when it has none."""
        for name in (caller, DEFAULT_CALLER):
            if (limit := self.callers.get(name)) is not None:
                return name, limit
        return None


class TokenBucket:
    """``capacity`` tokens of burst, refilled at ``rate`` per second."""

    def __init__(
        self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()

    def take(self) -> float:
        """Take a token: 0.0 when granted, else the seconds until one will be there."""
        wait = self.wait()
        if wait == 0.0:
            self._tokens -= 1
        return wait

    def wait(self) -> float:
        """Seconds until a token is there (0.0: now), taking nothing."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate


class RateLimiter:
    """Whether a topic or an agent may take one more task now (0.0), or in how long."""

    def __init__(self, config: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._topics: dict[str, TokenBucket] = {}
        self._agents: dict[str, tuple[RateLimit, TokenBucket]] = {}

    def topic_wait(self, topic: str) -> float:
        """Take a token for ``topic``: 0.0 when granted, else seconds until one is there."""
        limit = self.config.topics.get(topic)
        if limit is None:
            return 0.0
        bucket = self._topics.get(topic)
        if bucket is None:
            bucket = self._topics[topic] = TokenBucket(limit.rate, limit.burst, self._clock)
        return bucket.take()

    def agent_wait(self, card: AgentCard, *, take: bool) -> float:
        """Seconds until ``card``'s agent may take a task (0.0: now); ``take`` spends the token."""
        limit = self.config.agents.get(card.agent_id) or card.rate_limit
        if limit is None:
            return 0.0
        known = self._agents.get(card.agent_id)
        if known is None or known[0] != limit:  # new, or its card changed the limit
            known = self._agents[card.agent_id] = (
                limit,
                TokenBucket(limit.rate, limit.burst, self._clock),
            )
        bucket = known[1]
        return bucket.take() if take else bucket.wait()
