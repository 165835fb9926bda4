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
from broker.errors import translate
from broker.watch import BucketWatch, Change
from envelopes import AgentCard

log = structlog.get_logger("coordinator.directory")

_card_decoder = msgspec.json.Decoder(AgentCard)


class AgentDirectory:
    """Agent cards by id, current within milliseconds of a change in the bucket."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._cards: dict[str, AgentCard] = {}

    @property
    def cards(self) -> dict[str, AgentCard]:
        return dict(self._cards)

    async def follow(self, ready: asyncio.Event) -> None:
        """Keep the cache current until cancelled; ``ready`` is set after the first load."""
        kv = await self._broker.kv(self._broker.names.agents_bucket)
        async with BucketWatch(kv) as watch:
            waiter = asyncio.create_task(self._signal(watch, ready))
            try:
                async for change in watch:
                    self._apply(change)
            finally:
                waiter.cancel()

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
        return [card for card in registered if card.status == "running"], registered

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
    async def _signal(watch: BucketWatch, ready: asyncio.Event) -> None:
        await watch.initial.wait()
        ready.set()


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    except nats.errors.Error as exc:
        raise translate(exc) from exc
