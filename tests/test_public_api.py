"""What ``agentreach`` offers at its root: the names the README's examples use, and the
marker that lets type checkers read its annotations."""

from __future__ import annotations

import re
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


def test_every_error_of_the_sdk_s_error_tree_comes_from_the_root():
    """docs/python-sdk.md's error tree says they all import from ``agentreach``:
    WorkflowActionRefused, added to the tree, did not (a fresh reader's ImportError)."""
    text = (REPO / "docs" / "python-sdk.md").read_text()
    tree = text.split("### The error tree", 1)[1].split("```")[1]
    named = re.findall(r"^(?:[│ ]*[├└]── )?([A-Z]\w+)", tree, flags=re.MULTILINE)
    in_broker = {"BrokerError"}  # agentreach.broker's, as its line says
    assert len(named) > 20
    missing = [n for n in named if n not in in_broker and n not in agentreach.__all__]
    assert missing == []


def test_the_package_is_marked_typed():
    """``agentreach/py.typed`` exists and is package data, so an installed agentreach is
    read by type checkers (PEP 561) instead of being treated as untyped."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("agentreach", [])
    assert (Path(agentreach.__file__).parent / "py.typed").is_file()
