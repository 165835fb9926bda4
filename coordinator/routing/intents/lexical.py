"""The default scorer: BM25 (``bm25s``) over every description and example, no model needed.

Each intent is one BM25 document: its descriptions and examples together (every card that
serves it). On our labelled set this beats a document per text scored by its best text (top-1
66 % vs 60 %): a request's words are usually spread over the description and several examples.
The raw score grows with the request's length and words' rarity, so it is divided by the
request's *ideal* score — what an average-length text containing each of its words once would
get, with words no card uses counted at the rarest weight. The quotient says how much of the
request the intent explains: near 1 for a request made of that intent's words, near 0 for one
about something no agent offers, whatever its length. It is then weighed by how much the request
says (``calibration.said``: a one-word request is wholly explained by any intent that uses the
word, and is not therefore as sure as a sentence). ``Calibration`` turns that evidence and the
margin into a confidence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import bm25s
import numpy as np

from agentreach.coordinator.routing.intents.calibration import Calibration, ranked, said
from agentreach.coordinator.routing.intents.text import Tokenizer
from agentreach.coordinator.routing.intents.types import IntentText, Scored

# Fitted by ``python bench/intent.py --fit`` on bench/data/intents (319 requests, 11 intents,
# half Chinese, 48 of them bare words or pairs) with the pseudo-count below, which that command
# picks by cross-validated log-loss; its accuracy is in the README. Refit both for your own cards
# and requests with the same command (``--cards``, ``--requests``) if they disagree.
DEFAULT_CALIBRATION = Calibration(bias=-1.945, evidence=9.284, margin=12.587)
PSEUDO_WORDS = 8.0


@dataclass(frozen=True, slots=True)
class _Fitted:
    """Everything ``rank`` reads, made by one ``fit`` and swapped in whole: a fit may run in a
    worker thread while the event loop ranks with the previous one."""

    names: list[str]
    bm25: bm25s.BM25 | None = None
    owners: np.ndarray | None = None  # doc -> intent; an intent with no token has no doc
    idf: dict[str, float] | None = None
    oov_idf: float = 0.0


class BM25Scorer:
    """Lexical intent scorer: ``fit`` on intents, then ``rank`` requests in tens of µs."""

    name = "bm25"

    def __init__(
        self,
        *,
        tokenizer: Tokenizer | None = None,
        calibration: Calibration = DEFAULT_CALIBRATION,
        k1: float = 1.2,
        b: float = 0.75,
        oov_weight: float = 1.0,
        pseudo_words: float = PSEUDO_WORDS,
    ) -> None:
        self.tokenizer = tokenizer or Tokenizer()
        self.calibration = calibration
        if pseudo_words < 0:
            raise ValueError(f"pseudo_words must be >= 0, not {pseudo_words}")
        self.k1, self.b, self.oov_weight = k1, b, oov_weight
        self.pseudo_words = pseudo_words
        self._unit = 1.0 / (1.0 + k1)  # a word seen once in an average-length text
        self._tokens: dict[str, list[str]] = {}  # text -> tokens; survives refits
        self._fitted = _Fitted(names=[])

    def fit(self, intents: Mapping[str, IntentText]) -> None:
        """Rebuild the index. Texts seen before are not tokenized again, so a refit after one
        card changed costs only the matrix build."""
        names = sorted(intents)
        tokens: dict[str, list[str]] = {}
        docs, owners = [], []
        for i, name in enumerate(names):
            doc = []
            for text in intents[name].texts():
                tokens[text] = self._tokens.get(text) or self.tokenizer(text)
                doc += tokens[text]
            if doc:
                docs.append(doc)
                owners.append(i)
        self._tokens = tokens
        if not docs:
            self._fitted = _Fitted(names=names)
            return
        bm25 = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        bm25.index(docs, show_progress=False)
        oov_idf = math.log(1 + (len(docs) + 0.5) / 0.5) * self.oov_weight
        self._fitted = _Fitted(names, bm25, np.asarray(owners), _idf(docs), oov_idf)

    def rank(self, text: str, k: int = 5) -> list[Scored]:
        """The best ``k`` intents for ``text``, each with its confidence and evidence."""
        fitted = self._fitted
        if not fitted.names:
            return []
        return ranked(fitted.names, self._evidence(fitted, text), self.calibration, k)

    def evidence(self, text: str) -> np.ndarray:
        """Per intent (in sorted-name order): its BM25 score / the request's ideal score (at
        most 1), times ``said(text, pseudo_words)``."""
        return self._evidence(self._fitted, text)

    def _evidence(self, fitted: _Fitted, text: str) -> np.ndarray:
        evidence = np.zeros(len(fitted.names))
        query = list(dict.fromkeys(self.tokenizer(text)))  # repeats add nothing
        if fitted.bm25 is None or fitted.idf is None or not query:
            return evidence
        ideal = self._unit * sum(fitted.idf.get(t, fitted.oov_idf) for t in query)
        ids = fitted.bm25.get_tokens_ids(query)
        if not ids or ideal <= 0:
            return evidence
        # A word repeated in a short card scores above its ideal (up to k1 + 1 times), but no
        # intent explains more than all of a request: capped, a bare word stays a bare word.
        share = np.minimum(fitted.bm25.get_scores_from_ids(ids) / ideal, 1.0)
        evidence[fitted.owners] = share * said(text, self.pseudo_words)
        return evidence


def _idf(docs: list[list[str]]) -> dict[str, float]:
    """Lucene's idf, the one bm25s uses, for each term of the corpus."""
    df = Counter(t for doc in docs for t in set(doc))
    n = len(docs)
    return {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
