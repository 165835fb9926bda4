"""Errors of intent resolution.

ReachError
 └── IntentError
      └── ScorerUnavailable   a scorer's packages (or its model) are not installed
"""

from __future__ import annotations

from agentreach.errors import ReachError


class IntentError(ReachError):
    """Root of every error intent resolution raises."""


class ScorerUnavailable(IntentError, ValueError):
    """The scorer needs an optional package that is not installed; the message says which.
    A ValueError too, so that a config naming such a scorer fails with the path of the key."""
