"""How the CLI's processes log: console lines for people, JSON lines for machines."""

from __future__ import annotations

import os
import subprocess
import sys

SAY = (
    "import structlog; from agentreach.cli.logs import configure_logging;"
    " configure_logging('info', {fmt!r}); structlog.get_logger('t').info('said', n=1)"
)


def _logged(fmt: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SAY.format(fmt=fmt)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
        check=True,
    )
    return done.stderr


def test_console_lines_written_to_a_file_carry_no_colour_codes():
    """`--log-format console` into a file wrote escape codes around every word."""
    line = _logged("console")
    assert "said" in line and "n=1" in line
    assert "\x1b[" not in line


def test_auto_writes_json_lines_where_no_terminal_reads():
    assert '"event": "said"' in _logged("auto")
