"""Which agents exist and what they serve: a cache of the ``reach_agents`` bucket.

The bucket is the truth; this is a per-process view kept current by a watch,
so any coordinator replica can route. A miss re-reads the bucket before it is
believed, because a card written a moment ago may not have arrived yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import MappingProxyType

import structlog

from agentreach.broker import Broker, BucketWatch, Change
from agentreach.broker.errors import honour_cancellation
from agentreach.envelopes import AgentCard, DecodeError, Liveness, decode_as

log = structlog.get_logger("coordinator.directory")

REFRESH_MIN_S = 0.05


class AgentDirectory:
    """Agent cards by id (and by intent), current within milliseconds of a change in the
    bucket, and the coordinator's liveness verdicts."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._cards: dict[str, AgentCard] = {}
        self._by_intent: dict[str, list[AgentCard]] | None = None  # rebuilt after a change
        self.version = 0  # rises with every change of a card
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = 0.0
        self.liveness: dict[str, Liveness] = {}
        self.liveness_version = 0  # rises with every change of a liveness verdict

    @property
    def cards(self) -> Mapping[str, AgentCard]:
        """A read-only view (no copy: the router asks on every failure)."""
        return MappingProxyType(self._cards)

    def declared_deadline(self, agent_id: str, intent: str) -> int | None:
        """The ``deadline_ms`` the agent's card declares for ``intent``, if any."""
        card = self._cards.get(agent_id)
        spec = card.intents.get(intent) if card is not None else None
        return spec.deadline_ms if spec is not None else None

    def gone(self, agent_id: str) -> str | None:
        """Why the agent is not coming back by itself (stopped, forgotten, OFFLINE), or None
        while it runs (a SUSPECT agent is expected back)."""
        card = self._cards.get(agent_id)
        if card is None:
            return "no longer registered"
        if card.status != "running":
            return card.status
        return None if self.is_live(card) else "OFFLINE"

    async def follow(self, ready: asyncio.Event) -> None:
        """Keep the cache current until cancelled; ``ready`` is set after the first load."""
        names = self._broker.names
        cards = await self._broker.bucket(names.agents_bucket, AgentCard)
        liveness = await self._broker.bucket(names.liveness_bucket, Liveness)
        async with cards.watch() as card_watch, liveness.watch() as liveness_watch:
            waiter = asyncio.create_task(self._signal(card_watch, liveness_watch, ready))
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._follow_liveness(liveness_watch))
                    async for change in card_watch:
                        self._apply(change)
                        honour_cancellation()
            finally:
                waiter.cancel()

    async def _follow_liveness(self, watch: BucketWatch) -> None:
        async for change in watch:
            honour_cancellation()
            self.liveness_version += 1
            if change.value is None:
                self.liveness.pop(change.key, None)
                continue
            try:
                self.liveness[change.key] = decode_as(change.value, Liveness)
            except DecodeError as exc:
                log.warning("ignoring unreadable liveness", agent_id=change.key, error=str(exc))

    def serving(self, intent: str) -> list[AgentCard]:
        """Every registered agent whose card lists ``intent``, running or not."""
        if self._by_intent is None:
            index: dict[str, list[AgentCard]] = {}
            for card in self._cards.values():
                for name in card.intents:
                    index.setdefault(name, []).append(card)
            self._by_intent = index
        return self._by_intent.get(intent, [])

    async def refresh(self) -> None:
        """Read every card from the bucket again (cards gone from it are dropped).

        Callers at the same moment share one read, and reads are at least
        ``REFRESH_MIN_S`` apart: a flood of tasks nobody serves must not become a
        flood of bucket reads.
        """
        now = time.monotonic()
        running = self._refreshing
        if running is None or (running.done() and now - self._refreshed_at >= REFRESH_MIN_S):
            self._refreshed_at = now
            self._refreshing = running = asyncio.create_task(self._read_all())
        await asyncio.shield(running)

    async def _read_all(self) -> None:
        cards = await self._broker.bucket(self._broker.names.agents_bucket, AgentCard)
        present = await cards.snapshot()
        for gone in self._cards.keys() - present.keys():
            self._apply(Change(key=gone, value=None, revision=0))
        self._by_intent = None
        self.version += 1
        self._cards.update((key, e.value) for key, e in present.items() if _own(key, e.value))

    def can_take_work(self, card: AgentCard) -> bool:
        return self.why_not_working(card) is None

    def why_not_working(self, card: AgentCard) -> str | None:
        """None for a running, ONLINE (or not yet judged), unquarantined agent; else why not.

        A SUSPECT or OFFLINE verdict about an earlier process of the agent does not count.
        """
        if card.status != "running":
            return f"agent {card.status}"
        judged = self.liveness.get(card.agent_id)
        if judged is None:
            return None
        if judged.quarantined:
            return "agent quarantined"
        if judged.state in ("UNKNOWN", "ONLINE") or judged.epoch < card.epoch:
            return None
        return f"agent {judged.state}"

    def is_live(self, card: AgentCard) -> bool:
        """Whether ``card``'s agent is running and not judged OFFLINE (a SUSPECT or
        quarantined agent is still live: it is expected back)."""
        if card.status != "running":
            return False
        judged = self.liveness.get(card.agent_id)
        return judged is None or judged.state != "OFFLINE" or judged.epoch < card.epoch

    def _apply(self, change: Change) -> None:
        self._by_intent = None
        self.version += 1
        if change.value is None:
            self._cards.pop(change.key, None)
            return
        try:
            card = decode_as(change.value, AgentCard)
        except DecodeError as exc:
            log.warning("ignoring unreadable agent card", agent_id=change.key, error=str(exc))
            self._cards.pop(change.key, None)
            return
        if _own(change.key, card):
            self._cards[change.key] = card
        else:
            self._cards.pop(change.key, None)

    @staticmethod
    async def _signal(cards: BucketWatch, liveness: BucketWatch, ready: asyncio.Event) -> None:
        await cards.initial.wait()
        await liveness.initial.wait()
        ready.set()


def _own(key: str, card: AgentCard) -> bool:
    """Whether the card under ``key`` is that agent's: an agent may write only its own key
    (under permissions), and a card there naming another agent would draw that agent's
    tasks into a queue nobody consumes."""
    if card.agent_id == key:
        return True
    log.warning("ignoring a card that names another agent", key=key, names=card.agent_id)
    return False
