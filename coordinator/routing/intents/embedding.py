"""The optional scorer: sentence embeddings (all-MiniLM-L6-v2, shipped inside a PyPI wheel).

Every text of an intent is embedded once, at fit; a request is embedded once per resolution and
compared by cosine with all of them; an intent's evidence is its best cosine, weighed by how
much the request says (``calibration.said``): a bare word is close to a card example that
contains it ("blender" to "The blender arrived broken"), and its lead over the runner-up made
it sure (0.81) of an intent it does not ask for. It matches requests
that share no word with a card ("where's my stuff" / "where is my order"), which BM25 cannot, but
the model was trained on English: on Chinese it is close to guessing (see the README table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from agentreach.coordinator.routing.intents.calibration import Calibration, ranked, said
from agentreach.coordinator.routing.intents.types import IntentText, Scored

# Fitted by ``python bench/intent.py --fit``, like the BM25 default, with the pseudo-count below
# (picked there by cross-validated log-loss). The evidence weight is small: for this model the
# lead over the runner-up says almost all that the best cosine says.
DEFAULT_CALIBRATION = Calibration(bias=-1.465, evidence=0.147, margin=12.984)
PSEUDO_WORDS = 2.0


class Encoder(Protocol):
    """Anything that turns texts into unit vectors, one row per text."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class _Fitted:
    """What ``rank`` reads, swapped in whole by ``fit`` (which may run in a worker thread)."""

    names: list[str]
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    starts: np.ndarray | None = None  # first row of each intent's texts
    owners: np.ndarray | None = None  # the intent of each run of rows


class EmbeddingScorer:
    """Semantic intent scorer; ``EmbeddingScorer()`` loads the bundled MiniLM (numpy only)."""

    name = "minilm"

    def __init__(
        self,
        *,
        encoder: Encoder | None = None,
        calibration: Calibration = DEFAULT_CALIBRATION,
        pseudo_words: float = PSEUDO_WORDS,
    ) -> None:
        if pseudo_words < 0:
            raise ValueError(f"pseudo_words must be >= 0, not {pseudo_words}")
        if encoder is None:
            from agentreach.coordinator.routing.intents.minilm import shared_model

            encoder = shared_model()
        self.encoder = encoder
        self.calibration = calibration
        self.pseudo_words = pseudo_words
        self._vectors: dict[str, np.ndarray] = {}  # text -> vector; survives refits
        self._fitted = _Fitted(names=[])

    def fit(self, intents: Mapping[str, IntentText]) -> None:
        """Embed texts not seen before (the slow part, ~10 ms each) and stack all of them."""
        names = sorted(intents)
        texts = {t: i for i, name in enumerate(names) for t in intents[name].texts()}
        new = [t for t in texts if t not in self._vectors]
        if new:
            self._vectors.update(zip(new, self.encoder.encode(new), strict=True))
        self._vectors = {t: self._vectors[t] for t in texts}
        if not texts:
            self._fitted = _Fitted(names=names)
            return
        # rows grouped by intent, so that np.maximum.reduceat takes each intent's best text
        order = sorted(texts, key=texts.__getitem__)
        owners = np.array([texts[t] for t in order])
        starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
        matrix = np.stack([self._vectors[t] for t in order])
        self._fitted = _Fitted(names, matrix, starts, owners[starts])

    def rank(self, text: str, k: int = 5) -> list[Scored]:
        """The best ``k`` intents for ``text``, each with its confidence and best cosine."""
        fitted = self._fitted
        if not fitted.names:
            return []
        return ranked(fitted.names, self._evidence(fitted, text), self.calibration, k)

    def evidence(self, text: str) -> np.ndarray:
        """Per intent (in sorted-name order): the best cosine between ``text`` and its texts,
        times ``said(text, pseudo_words)``."""
        return self._evidence(self._fitted, text)

    def _evidence(self, fitted: _Fitted, text: str) -> np.ndarray:
        evidence = np.zeros(len(fitted.names))
        if not fitted.matrix.size or not text.strip():
            return evidence
        cosines = fitted.matrix @ self.encoder.encode([text])[0]
        weight = said(text, self.pseudo_words)
        evidence[fitted.owners] = np.maximum.reduceat(cosines, fitted.starts) * weight
        return evidence
