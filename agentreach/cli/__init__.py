"""The ``reach`` command line."""

from agentreach.cli.main import main

__all__ = ["main"]
