"""The scorers by name, imported only when asked for: their packages (numpy, bm25s, PyStemmer,
the model wheel) are an extra, and a coordinator that resolves nothing never loads them."""

from __future__ import annotations

from typing import Literal

from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
from agentreach.coordinator.routing.intents.types import Scorer

ScorerName = Literal["bm25", "minilm"]
SCORERS: tuple[ScorerName, ...] = ("bm25", "minilm")
INSTALL_HINT = "intent resolution needs its extra: pip install 'agentreach[intents]'"


def load_scorer(name: ScorerName) -> Scorer:
    """A fresh scorer called ``name``; :class:`ScorerUnavailable` (naming what to install)
    when its packages are missing."""
    try:
        if name == "bm25":
            from agentreach.coordinator.routing.intents.lexical import BM25Scorer

            return BM25Scorer()
        if name == "minilm":
            from agentreach.coordinator.routing.intents.embedding import EmbeddingScorer

            return EmbeddingScorer()
    except ImportError as exc:
        raise ScorerUnavailable(f"{INSTALL_HINT} (missing {exc.name})") from None
    raise ScorerUnavailable(f"unknown scorer {name!r}: use one of {', '.join(SCORERS)}")


def check_scorer(name: ScorerName) -> None:
    """Raise :class:`ScorerUnavailable` now if ``name``'s packages (or model) are missing,
    without loading it: checked with the config, so a missing extra is one line when the
    coordinator starts (or `reach routes check` runs), not an error per task."""
    try:
        import bm25s  # noqa: F401
        import numpy  # noqa: F401
        import Stemmer  # noqa: F401
    except ImportError as exc:
        raise ScorerUnavailable(f"{INSTALL_HINT} (missing {exc.name})") from None
    if name == "minilm":
        from agentreach.coordinator.routing.intents.minilm import model_dir

        model_dir()
