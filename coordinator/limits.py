"""Token buckets per topic (at intake) and per agent, as this replica enforces them."""

from __future__ import annotations

import time
from collections.abc import Callable

from agentreach.coordinator.config import RateLimits
from agentreach.coordinator.tokens import TokenBucket
from agentreach.envelopes import AgentCard, RateLimit


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
