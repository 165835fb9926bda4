"""The scorers by name, imported only when asked for: their packages (numpy, bm25s, PyStemmer,
the model wheel) are an extra, and a coordinator that resolves nothing never loads them.

``bm25`` and ``minilm`` are built in; ``module:factory`` names your own: a callable that takes
no argument and returns a :class:`~agentreach.coordinator.routing.intents.types.Scorer` whose
confidences are probabilities (calibrate them, e.g. with ``Calibration.fit`` on labelled
requests, so that the thresholds of the rule table keep their meaning).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
from agentreach.coordinator.routing.intents.types import Scorer

SCORERS = ("bm25", "minilm")
_PLUGIN = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"
ScorerName = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^(bm25|minilm|{_PLUGIN})$",
        description="bm25, minilm, or module:factory returning a Scorer",
    ),
]
INSTALL_HINT = "intent resolution needs its extra: pip install 'agentreach[intents]'"


def load_scorer(name: str) -> Scorer:
    """A fresh scorer called ``name``; :class:`ScorerUnavailable` (naming what to install)
    when its packages are missing."""
    if name not in SCORERS:
        return _plugin(name)()
    try:
        if name == "bm25":
            from agentreach.coordinator.routing.intents.lexical import BM25Scorer

            return BM25Scorer()
        from agentreach.coordinator.routing.intents.embedding import EmbeddingScorer

        return EmbeddingScorer()
    except ImportError as exc:
        raise ScorerUnavailable(f"{INSTALL_HINT} (missing {exc.name})") from None


def check_scorer(name: str) -> None:
    """Raise :class:`ScorerUnavailable` now if ``name``'s packages (or model) are missing,
    without loading it: checked with the config, so a missing extra is one line when the
    coordinator starts (or `reach routes check` runs), not an error per task."""
    if name not in SCORERS:
        _plugin(name)
        return
    try:
        import bm25s  # noqa: F401
        import numpy  # noqa: F401
        import Stemmer  # noqa: F401
    except ImportError as exc:
        raise ScorerUnavailable(f"{INSTALL_HINT} (missing {exc.name})") from None
    if name == "minilm":
        from agentreach.coordinator.routing.intents.minilm import model_dir

        model_dir()


def _plugin(name: str) -> Callable[[], Any]:
    if not re.fullmatch(_PLUGIN, name):
        raise ScorerUnavailable(f"scorer {name!r}: use bm25, minilm or module:factory")
    module, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ScorerUnavailable(f"scorer {name!r} cannot be loaded: {exc}") from None
    if not callable(factory):
        raise ScorerUnavailable(f"scorer {name!r} is not callable")
    return factory  # type: ignore[no-any-return]
