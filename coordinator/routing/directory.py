"""Which agents exist and what they serve: a cache of the ``reach_agents`` bucket.

The bucket is the truth; this is a per-process view kept current by a watch,
so any coordinator replica can route. A miss re-reads the bucket before it is
believed, because a card written a moment ago may not have arrived yet.

A card is the agent's own claim. With ``enforce_allowances`` (a coordinator with its seal
key: a secured deployment) only the intents the operators allowed that agent
(:mod:`agentreach.coordinator.routing.allowances`) are believed; the others are refused, kept in
``refused`` with the reason, and named once in an ``alert`` event. The same watch keeps
``priorities`` current: which priorities each sender may use
(:mod:`agentreach.coordinator.routing.priorities`), judged at intake.

Nothing but ``reach agents forget`` deletes a card (a stopped agent marks its own
``stopped``), so a delete tells the views of this process that keep something per agent
to drop it (:meth:`AgentDirectory.on_forget`): no restart is needed for the coordinator to
forget an agent, and a process that registers the id again starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, BucketWatch, Change, provision
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.coordinator.liveness.agent_control import tell_refused
from agentreach.coordinator.routing import allowances
from agentreach.coordinator.routing.allowances import Allowance
from agentreach.coordinator.routing.priorities import PriorityAllowances
from agentreach.envelopes import AgentCard, DecodeError, Liveness, decode_as
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.directory")

REFUSALS_SAID_PER_MINUTE = 3  # alerts (and lines) of refused intents, per agent
REFUSALS_SHOWN = 10  # of the intents a card names and its allowance refuses

REFRESH_MIN_S = 0.05


class AgentDirectory:
    """Agent cards by id (and by intent), current within milliseconds of a change in the
    bucket, and the coordinator's liveness verdicts."""

    def __init__(self, broker: Broker, *, enforce_allowances: bool = False) -> None:
        self._broker = broker
        self.priorities = PriorityAllowances()
        self.enforce_allowances = enforce_allowances
        self._cards: dict[str, AgentCard] = {}  # as believed: refused intents left out
        self._declared: dict[str, AgentCard] = {}  # as written by their agents
        self._allowed: dict[str, Allowance] = {}
        self.refused: dict[str, dict[str, str]] = {}  # agent → intent → why
        self._alerts: list[tuple[AgentCard, dict[str, str]]] = []
        self._refusals_said = RepeatedLines(60.0, burst=REFUSALS_SAID_PER_MINUTE)
        self._by_intent: dict[str, list[AgentCard]] | None = None  # rebuilt after a change
        self.version = 0  # rises with every change of a card
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = 0.0
        self.liveness: dict[str, Liveness] = {}
        self.liveness_version = 0  # rises with every change of a liveness verdict
        self._forgetting: list[Callable[[str], None]] = []
        self._seeing: list[Callable[[AgentCard], None]] = []

    def on_card(self, *see: Callable[[AgentCard], None]) -> None:
        """Call each ``see(card)`` when an agent's card is written (at the first load too),
        after the view has taken it in."""
        self._seeing += see

    def on_forget(self, *forget: Callable[[str], None]) -> None:
        """Call each ``forget(agent_id)`` when a card this view held is deleted (the agent
        was forgotten by an operator), after the view has dropped it."""
        self._forgetting += forget

    @property
    def enforce_allowances(self) -> bool:
        """Whether intent and priority allowances are enforced (a secured deployment)."""
        return self.priorities.enforced

    @enforce_allowances.setter
    def enforce_allowances(self, enforced: bool) -> None:
        self.priorities.enforced = enforced

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
        async with (
            cards.watch() as card_watch,
            liveness.watch() as liveness_watch,
            self._allowances_watch() as allowance_watch,
        ):
            watches = [card_watch, liveness_watch, *filter(None, [allowance_watch])]
            waiter = asyncio.create_task(self._signal(watches, ready))
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._follow_liveness(liveness_watch))
                    if allowance_watch is not None:
                        group.create_task(self._follow_allowances(allowance_watch))
                    async for change in card_watch:
                        self._apply(change)
                        await self._raise_alerts()
                        honour_cancellation()
            finally:
                waiter.cancel()

    @contextlib.asynccontextmanager
    async def _allowances_watch(self) -> AsyncIterator[BucketWatch | None]:
        """A watch of the allowances bucket (made if missing) when they are enforced."""
        if not self.enforce_allowances:
            yield None
            return
        names = self._broker.names
        await provision(self._broker, allowances.topology(names))
        bucket = await self._broker.bucket(allowances.bucket_name(names), Allowance)
        async with bucket.watch(repair=True) as watch:
            # Every allowance is known before the first card is judged: a card judged
            # without its allowance would raise a false alert at each start.
            for change in await watch.snapshot():
                self._allow(change)
            yield watch

    async def _follow_allowances(self, watch: BucketWatch) -> None:
        async for change in watch:
            honour_cancellation()
            self._allow(change)
            await self._raise_alerts()

    def _allow(self, change: Change) -> None:
        # (What the NATS server wrote over a key, which anyone may have it write, is not
        # taken by the watch: believed, it stopped an agent's work, or a caller's priority.)
        if (sender := allowances.sender_of_key(change.key)) is not None:
            self.priorities.apply(sender, change.value)
            return
        allowance = None
        if change.value is not None:
            try:
                allowance = decode_as(change.value, Allowance)
            except DecodeError as exc:  # believed as none: its agent serves nothing
                log.warning("unreadable allowance", agent_id=change.key, error=str(exc))
        if allowance is None:
            self._allowed.pop(change.key, None)
        else:
            self._allowed[change.key] = allowance
        self._believe(change.key)

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
        for gone in self._declared.keys() - present.keys():
            if await _unreadable(cards, gone):  # overwritten, not deleted: kept (see _apply)
                continue
            self._apply(Change(key=gone, value=None, revision=0))
        self._by_intent = None
        self.version += 1
        for key, entry in present.items():
            if _own(key, entry.value):
                self._declared[key] = entry.value
                self._believe(key)
        await self._raise_alerts()

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
        card = None
        if change.value is not None:
            try:
                card = decode_as(change.value, AgentCard)
            except DecodeError as exc:
                log.warning("ignoring unreadable agent card", agent_id=change.key, error=str(exc))
        held = None
        if card is not None and _own(change.key, card):
            self._declared[change.key] = card
        else:
            held = self._declared.pop(change.key, None)
        self._believe(change.key)
        if card is not None and held is None:
            for see in self._seeing:
                see(card)
        if held is None or change.value is not None:  # not deleted, or unreadable
            return
        if self.is_live(held):
            # Not `reach agents forget`, which refuses a live agent: the agent itself, say.
            # Its queue and breakers stay; it is judged as before and moved once OFFLINE.
            log.warning(
                "the card of a live agent was deleted: nothing more is routed to it, but it"
                " is not forgotten",
                agent_id=change.key,
            )
            return
        log.info("agent forgotten: its card was deleted", agent_id=change.key)
        for forget in self._forgetting:
            forget(change.key)

    def _believe(self, agent_id: str) -> None:
        """Put what routing believes of ``agent_id``'s card into the view."""
        self._by_intent = None
        self.version += 1
        card = self._declared.get(agent_id)
        if card is None:
            self._cards.pop(agent_id, None)
            self.refused.pop(agent_id, None)
            return
        refusals = {}
        if self.enforce_allowances:
            refusals = allowances.refused(card, self._allowed.get(agent_id))
        if refusals and refusals != self.refused.get(agent_id):
            self._alerts.append((card, refusals))
        if refusals:
            self.refused[agent_id] = refusals
        else:
            self.refused.pop(agent_id, None)
        self._cards[agent_id] = allowances.believed(card, refusals)

    async def _raise_alerts(self) -> None:
        """One ``alert`` per agent and set of refused intents: its id is derived from them,
        so the events stream drops the same alert from another replica or a re-read."""
        while self._alerts:
            card, refusals = self._alerts.pop(0)
            # A few a minute per agent: one rewriting its card with intents in and out of its
            # allowance raised an alert and a line (of all 800 intents) per rewrite.
            if (unsaid := self._refusals_said.due(card.agent_id)) is None:
                continue
            shown = dict(list(sorted(refusals.items()))[:REFUSALS_SHOWN])
            log.warning("intents refused", agent_id=card.agent_id, refused=shown,
                        count=len(refusals), more_not_said=unsaid)  # fmt: skip
            alert = agent_event(
                card.agent_id,
                "alert",
                problem="intent_not_allowed",
                intents=sorted(refusals)[:REFUSALS_SHOWN],
                count=len(refusals),
                why=next(iter(refusals.values())),
                epoch=card.epoch,
            )
            digest = hashlib.sha256("|".join(sorted(refusals)).encode()).hexdigest()[:16]
            alert = msgspec.structs.replace(
                alert, message_id=f"refused-{card.agent_id}-{card.epoch}-{digest}"
            )
            await emit(self._broker, alert)
            await tell_refused(self._broker, card.agent_id, refusals)  # a process running now

    @staticmethod
    async def _signal(watches: list[BucketWatch], ready: asyncio.Event) -> None:
        for watch in watches:
            await watch.initial.wait()
        ready.set()


async def _unreadable(cards: Bucket[AgentCard], key: str) -> bool:
    try:
        await cards.get(key)
    except DecodeError:
        return True
    return False


def _own(key: str, card: AgentCard) -> bool:
    """Whether the card under ``key`` is that agent's: an agent may write only its own key
    (under permissions), and a card there naming another agent would draw that agent's
    tasks into a queue nobody consumes."""
    if card.agent_id == key:
        return True
    log.warning("ignoring a card that names another agent", key=key, names=card.agent_id)
    return False
