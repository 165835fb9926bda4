"""The failover runs' reports, shown at the end of the session whatever the outcome."""

from __future__ import annotations

from collections.abc import Callable

import pytest

REPORTS = pytest.StashKey[list[str]]()


@pytest.fixture
def show_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Keeps a text for the terminal summary (a failover run's figures and accounting)."""
    return request.config.stash.setdefault(REPORTS, []).append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    for text in config.stash.get(REPORTS, []):
        terminalreporter.write_sep("=", "cluster failover")
        terminalreporter.write_line(text)
