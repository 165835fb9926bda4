"""Fixtures for the scorers' tests (pure logic: no server needed)."""

from __future__ import annotations

import pytest

from agentreach.coordinator.routing.intents.types import IntentText
from tests.coordinator.routing.intents.labelled import load_cards


@pytest.fixture(scope="session")
def cards() -> dict[str, IntentText]:
    return load_cards()


@pytest.fixture(scope="session")
def minilm():  # type: ignore[no-untyped-def]
    """The real model, or a skip when its wheel is not installed."""
    from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
    from agentreach.coordinator.routing.intents.minilm import shared_model

    try:
        return shared_model()
    except ScorerUnavailable as exc:
        pytest.skip(str(exc))
