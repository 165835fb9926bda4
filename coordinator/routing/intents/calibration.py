"""Raw scores to calibrated confidence, the same way for every scorer.

A scorer reports, for each intent, its *evidence*: a match strength (for BM25, the share of the
request's term weight that the intent's texts match; for embeddings, the best cosine), times
:func:`said`, how much the request says: ``n / (n + pseudo_words)`` for a request of ``n``
:func:`words`. Without that factor a one-word request ("refund", "money", "blender") is wholly
explained by any intent whose text has the word, and was delivered as surely as a full sentence
(BM25: 0.999), yet a bare word names the right intent about half the time; the pseudo-count is
picked by ``bench/intent.py --fit`` (cross-validated log-loss) with the calibration. Two numbers
per candidate then feed a logistic model:

* ``evidence`` — how much of the request the candidate explains (absolute term: catches
  out-of-scope requests that match nothing well);
* ``margin`` — its evidence minus the best *other* candidate's (relative term: catches requests
  that two intents explain equally well; negative for every candidate but the top one).

``confidence = sigmoid(bias + w_e * evidence + w_m * margin)`` with ``w_e, w_m >= 0``, fitted on
labelled requests so that it estimates the probability that the candidate is the right intent.
Because it is a probability for every scorer, one threshold means the same for all of them: with
calibrated confidences, delivering above ``t`` is the cheapest policy when a wrong delivery costs
``1 / (1 - t)`` times a manual review (``t = 0.75``: a wrong delivery costs 4 manual reviews).
The weights are kept non-negative so that confidence never falls as evidence rises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from agentreach.coordinator.routing.intents.types import Scored

_LATIN_WORD = re.compile(r"[A-Za-z0-9]+")
_CJK_CHAR = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def words(text: str) -> float:
    """How much ``text`` says, in words: Latin words, and Chinese characters at 1.5 a word (about
    a Chinese word's mean length; BM25's tokens would count Chinese text some three times over,
    bigrams and characters, and at two characters a word Chinese requests came out unsure)."""
    return len(_LATIN_WORD.findall(text)) + len(_CJK_CHAR.findall(text)) / 1.5


def said(text: str, pseudo_words: float) -> float:
    """The factor on a request's evidence: ``n / (n + pseudo_words)`` for ``n`` words, as if
    every request also said ``pseudo_words`` words that no intent matches."""
    n = words(text)
    return n / (n + pseudo_words) if n + pseudo_words > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted logistic map from (evidence, margin) to a confidence in 0 to 1."""

    bias: float
    evidence: float
    margin: float

    def confidence(self, evidence: float, margin: float) -> float:
        """The calibrated confidence for one candidate."""
        z = self.bias + self.evidence * evidence + self.margin * margin
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))

    @classmethod
    def fit(cls, samples: Iterable[tuple[float, float, bool]], *, l2: float = 1e-4) -> Calibration:
        """Fit on ``(evidence, margin, is_right_intent)`` triples by Newton's method on the
        L2-regularised log-loss, with the two weights held non-negative (active set)."""
        data = np.array([(e, m, float(y)) for e, m, y in samples], dtype=np.float64)
        if len(data) == 0 or data[:, 2].min() == data[:, 2].max():
            raise ValueError("calibration needs both right and wrong candidates")
        x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        w = _newton(x, data[:, 2], l2, free=[0, 1, 2])
        free = [0] + [j for j in (1, 2) if w[j] > 0]
        if len(free) < 3:
            w = _newton(x, data[:, 2], l2, free=free)
        return cls(bias=float(w[0]), evidence=float(w[1]), margin=float(w[2]))


def _newton(x: np.ndarray, y: np.ndarray, l2: float, *, free: list[int]) -> np.ndarray:
    w = np.zeros(x.shape[1])
    xf = x[:, free]
    penalty = np.diag([0.0] + [l2 * len(y)] * (len(free) - 1))  # the bias is not shrunk
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        grad = xf.T @ (p - y) + penalty @ w[free]
        hess = xf.T @ (xf * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hess + 1e-9 * np.eye(len(free)), grad)
        w[free] -= step
        if np.abs(step).max() < 1e-9:
            break
    return w


def features(evidence: Sequence[float]) -> list[tuple[float, float]]:
    """(evidence, margin) for candidates already sorted best first: the top one's margin is over
    the runner-up (over 0 when it stands alone), every other one's is against the top."""
    if not evidence:
        return []
    top = evidence[0]
    runner_up = evidence[1] if len(evidence) > 1 else 0.0
    return [(top, top - runner_up)] + [(e, e - top) for e in evidence[1:]]


def ranked(
    names: Sequence[str], evidence: np.ndarray, calibration: Calibration, k: int
) -> list[Scored]:
    """The ``k`` best intents as ``Scored``. ``names`` are sorted, and the sort is stable, so
    ties go to the alphabetically first intent and the result is deterministic."""
    if len(names) == 0 or k <= 0:
        return []
    order = np.argsort(-evidence, kind="stable")[: max(k, 2)]
    top = [float(evidence[i]) for i in order]
    scored = [
        Scored(names[i], calibration.confidence(e, m), e)
        for i, (e, m) in zip(order, features(top), strict=True)
    ]
    return scored[:k]
