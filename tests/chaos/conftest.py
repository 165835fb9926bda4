"""The chaos runs' accounting tables, shown at the end of the session whatever the outcome."""

from __future__ import annotations

from collections.abc import Callable

import pytest

REPORTS = pytest.StashKey[list[str]]()


@pytest.fixture
def show_at_end(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Keeps a text for the terminal summary (the accounting table of a chaos run)."""
    return request.config.stash.setdefault(REPORTS, []).append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Each chaos run's report, under its own heading, after the test results."""
    for text in config.stash.get(REPORTS, []):
        terminalreporter.write_sep("=", "chaos accounting")
        terminalreporter.write_line(text)
