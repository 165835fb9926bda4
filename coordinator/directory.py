"""Which agents exist and what they serve: a cache of the ``reach_agents`` bucket.

The bucket is the truth; this is a per-process view kept current by a watch,
so any coordinator replica can route. A miss re-reads the bucket before it is
believed, because a card written a moment ago may not have arrived yet.
"""

from __future__ import annotations

import asyncio

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from broker import Broker
from broker.errors import honour_cancellation, translate
from broker.watch import BucketWatch, Change
from envelopes import AgentCard, Liveness

log = structlog.get_logger("coordinator.directory")

_card_decoder = msgspec.json.Decoder(AgentCard)
_liveness_decoder = msgspec.json.Decoder(Liveness)


class AgentDirectory:
    """Agent cards by id, current within milliseconds of a change in the bucket."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._cards: dict[str, AgentCard] = {}
        self.liveness: dict[str, Liveness] = {}

    @property
    def cards(self) -> dict[str, AgentCard]:
        return dict(self._cards)

    async def follow(self, ready: asyncio.Event) -> None:
        """Keep the cache current until cancelled; ``ready`` is set after the first load."""
        names = self._broker.names
        cards = await self._broker.kv(names.agents_bucket)
        liveness = await self._broker.kv(names.liveness_bucket)
        async with BucketWatch(cards) as card_watch, BucketWatch(liveness) as liveness_watch:
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
            if change.value is None:
                self.liveness.pop(change.key, None)
                continue
            try:
                self.liveness[change.key] = _liveness_decoder.decode(change.value)
            except msgspec.DecodeError as exc:
                log.warning("ignoring unreadable liveness", agent_id=change.key, error=str(exc))

    async def candidates(self, topic: str) -> tuple[list[AgentCard], list[AgentCard]]:
        """(running agents that serve ``topic``, every registered one that does).

        When none is running the bucket is read again before the answer is believed.
        """
        running, registered = self._serving(topic)
        if not running:
            await self.refresh()
            running, registered = self._serving(topic)
        return running, registered

    async def refresh(self) -> None:
        """Read every card from the bucket."""
        kv = await self._broker.kv(self._broker.names.agents_bucket)
        for key in await _keys(kv):
            try:
                entry = await kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                self._cards.pop(key, None)  # deleted since keys() answered
                continue
            except nats.errors.Error as exc:
                raise translate(exc) from exc
            self._apply(Change(key=key, value=entry.value, revision=entry.revision or 0))

    def _serving(self, topic: str) -> tuple[list[AgentCard], list[AgentCard]]:
        registered = [card for card in self._cards.values() if topic in card.intents]
        return [card for card in registered if self.can_take_work(card)], registered

    def can_take_work(self, card: AgentCard) -> bool:
        """Running and not quarantined; not SUSPECT or OFFLINE unless restarted since."""
        if card.status != "running":
            return False
        judged = self.liveness.get(card.agent_id)
        if judged is None or judged.state in ("UNKNOWN", "ONLINE"):
            return judged is None or not judged.quarantined
        return not judged.quarantined and judged.epoch < card.epoch

    def _apply(self, change: Change) -> None:
        if change.value is None:
            self._cards.pop(change.key, None)
            return
        try:
            self._cards[change.key] = _card_decoder.decode(change.value)
        except msgspec.DecodeError as exc:
            log.warning("ignoring unreadable agent card", agent_id=change.key, error=str(exc))
            self._cards.pop(change.key, None)

    @staticmethod
    async def _signal(cards: BucketWatch, liveness: BucketWatch, ready: asyncio.Event) -> None:
        await cards.initial.wait()
        await liveness.initial.wait()
        ready.set()


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    except nats.errors.Error as exc:
        raise translate(exc) from exc
