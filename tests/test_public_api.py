"""What ``agentreach`` offers at its root: the names the README's examples use, and the
marker that lets type checkers read its annotations."""

from __future__ import annotations

import tomllib
from pathlib import Path

import agentreach

REPO = Path(__file__).parents[1]


def test_names_the_readme_uses_come_from_the_root():
    """Auth (``auth=Auth(creds=...)``), Broker (``ManualReview(broker, ...)``), the errors a
    program catches (AgentIdInUse from Agent.run, InvalidArgument) and the rest of the
    examples' names import from ``agentreach`` and are listed in ``__all__``."""
    used = {
        "Agent",
        "AgentIdInUse",
        "Auth",
        "Broker",
        "CompensationWorker",
        "InvalidArgument",
        "ManualReview",
        "PermanentError",
        "RateLimit",
        "ReachClient",
        "TaskContext",
    }
    assert used <= set(agentreach.__all__)
    assert all(hasattr(agentreach, name) for name in agentreach.__all__)


def test_the_package_is_marked_typed():
    """``agentreach/py.typed`` exists and is package data, so an installed agentreach is
    read by type checkers (PEP 561) instead of being treated as untyped."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("agentreach", [])
    assert (Path(agentreach.__file__).parent / "py.typed").is_file()
