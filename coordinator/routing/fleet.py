"""Choosing one agent from a rule's pools — alive, allowed, not drowning, least loaded —
and admitting the task to it: its rate token, its breaker's trial, its queue's count.

Each pool's share of the traffic is its weight times the fraction of its agents
that can take work now, so a split or a canary shifts away from a destination
that is down, tripped or full, and back as it recovers. Within the pool a
breaker that wants a trial call gets it first; otherwise the less loaded of two
random agents wins (power of two choices).

A large pool is judged on a random sample of ``SAMPLE`` agents (plus any with a
tripped breaker), so a decision costs the same with 1,000 agents as with 50;
only when the sample holds no agent that can take work is the whole pool read,
so a refusal always has its true reason.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentreach.coordinator.protection.breaker_board import BreakerBoard
from agentreach.coordinator.protection.queues import QueueDepths
from agentreach.coordinator.protection.rate_limits import RateLimiter
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.rules import Pool
from agentreach.envelopes import AgentCard, Priority, now_ms

SAMPLE = 32
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

    def why(self, summary: str, topic: str) -> str:
        """``summary`` for ``topic``, with the first agents passed over and why."""
        shown = "; ".join(f"{a}: {why}" for a, why in list(self.passed_over.items())[:5])
        return f"{summary} for {topic!r} ({shown})"


@dataclass(slots=True)
class _Pool:
    """One pool as judged for one decision."""

    pool: Pool
    members: int = 0  # registered agents the pool admits
    judged: list[str] = field(default_factory=list)  # all of them, or a sample
    ready: list[AgentCard] = field(default_factory=list)
    trials: dict[str, str] = field(default_factory=dict)  # agent_id → breaker key
    passed_over: dict[str, str] = field(default_factory=dict)
    hindrances: Counter[Hindrance] = field(default_factory=Counter)
    rate_wait_s: float = float("inf")

    @property
    def share(self) -> float:
        return self.pool.weight * len(self.ready) / len(self.judged) if self.judged else 0.0


class Fleet:
    """What the router knows about agents, put together to choose one and admit a task."""

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
        self._membership: dict[Pool, tuple[int, list[AgentCard]]] = {}

    async def refresh(self) -> None:
        """Read the registry again (a card written a moment ago may not have arrived)."""
        await self.directory.refresh()

    async def admit(self, choice: Choice, message_id: str) -> Excluded | None:
        """Spend the chosen agent's rate token (and its breaker's trial, if the call is one);
        None when admitted, else why that agent cannot take the task after all."""
        card = choice.agent
        assert card is not None
        # Taken before any await: concurrent decisions must not spend the same token.
        if (wait_s := self.limiter.agent_wait(card, take=True)) > 0:
            return "rate", f"rate limited for {wait_s * 1000:.0f} ms"
        if choice.trial_key and not await self.breakers.begin_trial(choice.trial_key, message_id):
            return "circuit", "its breaker's trial calls were taken meanwhile"
        return None

    def no_route(self, topic: str) -> str:
        """Why no agent serves ``topic``: none declares it, or those that do may not serve it
        (intent allowances, on a secured deployment: named, with the fix)."""
        said = f"no agent serves topic {topic!r}"
        declared = sorted(a for a, intents in self.directory.refused.items() if topic in intents)
        if not declared:
            return said
        # Each with its own reason: one agent's said for all read as if it were theirs too.
        reasons = "; ".join(f"{a}: {self.directory.refused[a][topic]}" for a in declared[:3])
        more = f"; +{len(declared) - 3} more" if len(declared) > 3 else ""
        return f"{said}: declared by {', '.join(declared[:5])}, not allowed it ({reasons}{more})"

    def circuit_open(self, choice: Choice, topic: str) -> tuple[str, int | None]:
        """Why every agent of ``topic`` is kept from it by a breaker, and how soon one of
        those breakers lets a trial call through (a refused caller may send again then)."""
        now, times = now_ms(), []
        for record in self.breakers.records.values():
            if record.state == "open" and record.intent in (topic, ""):
                times.append(max(0, record.open_until_ms - now))
        return choice.why("every breaker is open", topic), min(times) if times else None

    def reserve(self, agent_id: str, priority: Priority, message_id: str) -> None:
        """The task goes to the agent's queue now: its place there is taken."""
        self.queues.reserve(agent_id, priority, message_id)

    def dispatched(self, agent_id: str, priority: Priority, message_id: str, seq: int) -> None:
        """The task is in the agent's queue, stored as ``seq``."""
        self.queues.stored(agent_id, priority, message_id, seq)

    def not_dispatched(self, agent_id: str, priority: Priority, message_id: str) -> None:
        """The task did not reach the agent's queue: its place is free again."""
        self.queues.release(agent_id, priority, message_id)

    def refused(self, agent_id: str, priority: Priority) -> Excluded:
        """The broker refused the task: the agent's queue is at capacity."""
        self.queues.refused(agent_id, priority)
        return "full", f"{priority} queue full (refused by the broker)"

    def choose(
        self, pools: Sequence[Pool], priority: Priority, excluded: Mapping[str, Excluded]
    ) -> Choice:
        choice = Choice()
        sized = [self._size(pool, priority, excluded) for pool in pools]
        for judged in sized:
            choice.registered += judged.members
            choice.candidates += judged.judged
            choice.passed_over.update(judged.passed_over)
            choice.hindrances.update(judged.hindrances)
            choice.rate_wait_s = min(choice.rate_wait_s, judged.rate_wait_s)
        weighted = [p for p in sized if p.share > 0]
        if not weighted:
            return choice
        if len(weighted) == 1:
            picked = weighted[0]  # the common case: no weighted draw to make
        else:
            (picked,) = self._rng.choices(weighted, weights=[p.share for p in weighted])
        choice.pool, choice.intent = picked.pool.label, picked.pool.intent
        trial = [c for c in picked.ready if c.agent_id in picked.trials]
        if trial:
            choice.agent = self._rng.choice(trial)
            choice.trial_key = picked.trials[choice.agent.agent_id]
        else:
            choice.agent = self._least_loaded_of_two(picked.ready, priority)
        return choice

    def _size(self, pool: Pool, priority: Priority, excluded: Mapping[str, Excluded]) -> _Pool:
        members = self._members(pool)
        if len(members) > SAMPLE:
            sampled = self._judge(pool, self._sample(members), priority, excluded)
            if sampled.ready:
                sampled.members = len(members)
                return sampled
        judged = self._judge(pool, members, priority, excluded)
        judged.members = len(members)
        return judged

    def _sample(self, members: list[AgentCard]) -> list[AgentCard]:
        """``SAMPLE`` random members, and every member with a tripped breaker (for trials)."""
        sample = self._rng.sample(members, SAMPLE)
        tripped = self.breakers.tripped_agents()
        if tripped:
            chosen = {c.agent_id for c in sample}
            sample += [c for c in members if c.agent_id in tripped and c.agent_id not in chosen]
        return sample

    def _judge(
        self,
        pool: Pool,
        cards: list[AgentCard],
        priority: Priority,
        excluded: Mapping[str, Excluded],
    ) -> _Pool:
        judged = _Pool(pool, judged=[c.agent_id for c in cards])
        for card in cards:
            hindrance, why = self._hindrance(card, pool.intent, priority, excluded, judged)
            if hindrance is None:
                judged.ready.append(card)
                continue
            judged.passed_over[card.agent_id] = why
            judged.hindrances[hindrance] += 1
            if hindrance == "rate":
                wait = self.limiter.agent_wait(card, take=False)
                judged.rate_wait_s = min(judged.rate_wait_s, wait)
        return judged

    def _members(self, pool: Pool) -> list[AgentCard]:
        """The registered agents ``pool`` admits (cached until a card changes)."""
        version = self.directory.version
        cached = self._membership.get(pool)
        if cached is not None and cached[0] == version:
            return cached[1]
        members = [
            card
            for card in self.directory.serving(pool.intent)
            if pool.admits(card.agent_id, card.tags)
        ]
        if len(self._membership) > 1024:
            self._membership.clear()
        self._membership[pool] = (version, members)
        return members

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

        def load(card: AgentCard) -> float:
            # Its queue per slot it runs: by depth alone an agent of 3 slots beside ones of 11
            # was picked while full, and its tasks waited (invokes timed out unacknowledged).
            slots = sum(intent.capacity for intent in card.intents.values()) or 1
            return self.queues.depth(card.agent_id, priority) / slots

        return second if load(second) < load(first) else first
