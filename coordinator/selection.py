"""Choosing one agent from a rule's pools: alive, allowed, not drowning, least loaded.

Each pool's share of the traffic is its weight times the fraction of its agents
that can take work now, so a split or a canary shifts away from a destination
that is down, tripped or full, and back as it recovers. Within the pool a
breaker that wants a trial call gets it first; otherwise the less loaded of two
random agents wins (power of two choices).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from coordinator.breakers import BreakerBoard
from coordinator.directory import AgentDirectory
from coordinator.limits import RateLimiter
from coordinator.queues import QueueDepths
from coordinator.rules import Pool
from envelopes import AgentCard, Priority

Hindrance = Literal["down", "circuit", "full", "rate"]
Excluded = tuple[Hindrance, str]  # an agent that refused this task already, and why


@dataclass(slots=True)
class Choice:
    """The chosen agent, or why there is none; and what was considered."""

    agent: AgentCard | None = None
    pool: str = ""
    intent: str = ""
    trial_key: str = ""  # the breaker this call is a trial for
    registered: int = 0
    candidates: list[str] = field(default_factory=list)
    passed_over: dict[str, str] = field(default_factory=dict)
    hindrances: Counter[Hindrance] = field(default_factory=Counter)
    rate_wait_s: float = float("inf")


@dataclass(slots=True)
class _Pool:
    pool: Pool
    ready: list[AgentCard] = field(default_factory=list)
    trials: dict[str, str] = field(default_factory=dict)  # agent_id → breaker key
    members: int = 0

    @property
    def share(self) -> float:
        return self.pool.weight * len(self.ready) / self.members if self.members else 0.0


class Fleet:
    """What the router knows about agents, put together to choose one."""

    def __init__(
        self,
        directory: AgentDirectory,
        breakers: BreakerBoard,
        queues: QueueDepths,
        limiter: RateLimiter,
        rng: random.Random | None = None,
    ) -> None:
        self.directory = directory
        self.breakers = breakers
        self.queues = queues
        self.limiter = limiter
        self._rng = rng or random.Random()

    def choose(
        self, pools: Sequence[Pool], priority: Priority, excluded: Mapping[str, Excluded]
    ) -> Choice:
        choice = Choice()
        sized = [self._size(pool, priority, excluded, choice) for pool in pools]
        weighted = [p for p in sized if p.share > 0]
        if not weighted:
            return choice
        (picked,) = self._rng.choices(weighted, weights=[p.share for p in weighted])
        choice.pool, choice.intent = picked.pool.label, picked.pool.intent
        trial = [c for c in picked.ready if c.agent_id in picked.trials]
        if trial:
            choice.agent = self._rng.choice(trial)
            choice.trial_key = picked.trials[choice.agent.agent_id]
        else:
            choice.agent = self._least_loaded_of_two(picked.ready, priority)
        return choice

    def _size(
        self, pool: Pool, priority: Priority, excluded: Mapping[str, Excluded], choice: Choice
    ) -> _Pool:
        sized = _Pool(pool)
        for card in self.directory.serving(pool.intent):
            if not pool.admits(card.agent_id, card.tags):
                continue
            sized.members += 1
            choice.registered += 1
            choice.candidates.append(card.agent_id)
            hindrance, why = self._hindrance(card, pool.intent, priority, excluded, sized)
            if hindrance is None:
                sized.ready.append(card)
            else:
                choice.passed_over[card.agent_id] = why
                choice.hindrances[hindrance] += 1
                if hindrance == "rate":
                    choice.rate_wait_s = min(
                        choice.rate_wait_s, self.limiter.agent_wait(card, take=False)
                    )
        return sized

    def _hindrance(
        self,
        card: AgentCard,
        intent: str,
        priority: Priority,
        excluded: Mapping[str, Excluded],
        pool: _Pool,
    ) -> tuple[Hindrance | None, str]:
        if card.agent_id in excluded:
            return excluded[card.agent_id]
        if why := self.directory.why_not_working(card):
            return "down", why
        admission, key = self.breakers.admission(card.agent_id, intent)
        if admission.verdict == "blocked":
            return "circuit", admission.why
        if why := self.queues.why_full(card.agent_id, priority):
            return "full", why
        if (wait := self.limiter.agent_wait(card, take=False)) > 0:
            return "rate", f"rate limited for {wait * 1000:.0f} ms"
        if admission.verdict == "trial":
            pool.trials[card.agent_id] = key
        return None, ""

    def _least_loaded_of_two(self, ready: list[AgentCard], priority: Priority) -> AgentCard:
        if len(ready) == 1:
            return ready[0]
        first, second = self._rng.sample(ready, 2)
        load = self.queues.load
        return second if load(second.agent_id, priority) < load(first.agent_id, priority) else first
