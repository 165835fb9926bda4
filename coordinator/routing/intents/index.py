"""The live set of agents' intent texts, and ranking a request's text against it.

Cards change rarely (an agent registers, edits its card, goes offline); requests are frequent.
So ``put``/``remove`` only record the change, and the scorer is refitted once, on the next
``refresh`` — a burst of registrations costs one refit — and a refit reuses the scorer's cache of
texts already tokenized or embedded, so it costs the new texts plus an index rebuild.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentreach.coordinator.routing.intents.types import IntentText, Scored, Scorer


class IntentIndex:
    """Agents' intents in, ranked candidates out: ``put`` a card, ``remove`` an agent,
    ``refresh`` (the slow part, once per change), then ``rank`` text (the fast part)."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self._cards: dict[str, dict[str, IntentText]] = {}
        self._dirty = True
        self.fits = 0  # how many times the scorer was refitted, for tests and metrics

    @property
    def stale(self) -> bool:
        """Whether a card changed since the last refit."""
        return self._dirty

    def put(self, agent_id: str, intents: Mapping[str, IntentText]) -> None:
        """Add or replace one agent's intents (it registered, changed its card or came back)."""
        card = dict(intents)
        if self._cards.get(agent_id) != card:
            self._cards[agent_id] = card
            self._dirty = True

    def remove(self, agent_id: str) -> None:
        """Forget an agent (it went offline or deregistered); unknown ids are ignored."""
        if self._cards.pop(agent_id, None) is not None:
            self._dirty = True

    def agents(self) -> set[str]:
        """The agents whose intents are in the index."""
        return set(self._cards)

    def intents(self) -> dict[str, IntentText]:
        """Every intent some agent in the index serves, its cards' texts merged."""
        parts: dict[str, list[IntentText]] = {}
        # sorted: the merged order, hence the result, is stable
        for agent_id in sorted(self._cards):
            for name, text in self._cards[agent_id].items():
                parts.setdefault(name, []).append(text)
        return {name: IntentText.merge(texts) for name, texts in parts.items()}

    def refresh(self) -> None:
        """Refit the scorer now if any card changed."""
        if (intents := self.changed()) is not None:
            self.fit(intents)

    def changed(self) -> dict[str, IntentText] | None:
        """The intents to fit if a card changed since the last call, else None. Split from
        :meth:`fit` so that the cards are read on the caller's thread and only the fit runs in
        a worker thread."""
        if not self._dirty:
            return None
        self._dirty = False
        return self.intents()

    def fit(self, intents: Mapping[str, IntentText]) -> None:
        """Refit the scorer on ``intents``. Safe in a worker thread while ``rank`` runs: the
        scorer swaps its new state in whole, so a ranking never sees half of a refit."""
        self.scorer.fit(intents)
        self.fits += 1

    def rank(self, text: str, k: int = 2) -> list[Scored]:
        """The ``k`` best intents for ``text`` as of the last refit, best first."""
        return self.scorer.rank(text, k=k)
