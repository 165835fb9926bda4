"""The values every scorer shares: what an intent says about itself, and a scored match."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class IntentText:
    """What an agent registers for one intent: a description and example requests."""

    description: str
    examples: tuple[str, ...] = field(default=())

    def texts(self) -> tuple[str, ...]:
        """Every non-empty text, description first; each is matched on its own."""
        seen: dict[str, None] = {}
        for text in (self.description, *self.examples):
            if text.strip():
                seen.setdefault(text.strip(), None)
        return tuple(seen)

    @classmethod
    def merge(cls, parts: Sequence[IntentText]) -> IntentText:
        """One intent served by several cards: the first description leads, the rest join
        the examples. Texts are scored one by one, so the split only matters for display."""
        texts: dict[str, None] = {}
        for part in parts:
            texts.update(dict.fromkeys(part.texts()))
        head, *rest = list(texts) or [""]
        return cls(description=head, examples=tuple(rest))


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate intent for a request: calibrated confidence in 0 to 1 and the raw score."""

    intent: str
    confidence: float
    score: float


@runtime_checkable
class Scorer(Protocol):
    """Matches request text against intents. ``fit`` is called when cards change (rarely),
    ``rank`` for every request (often): work that depends only on the cards belongs in fit."""

    name: str

    def fit(self, intents: Mapping[str, IntentText]) -> None:
        """Index these intents, replacing the previous set."""
        ...

    def rank(self, text: str, k: int = 5) -> list[Scored]:
        """The best ``k`` intents for ``text``, highest confidence first; [] if none fitted."""
        ...
