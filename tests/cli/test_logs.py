"""How the CLI's processes log: console lines for people, JSON lines for machines."""

from __future__ import annotations

import json
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


def test_what_a_command_says_to_its_user_is_a_json_line_among_json_logs():
    """`reach coordinator --log-format json` wrote one plain line among its JSON lines (the
    "serving … (Ctrl-C to stop)" banner), which a log collector could not read."""
    code = (
        "from agentreach.cli.logs import configure_logging, say;"
        " configure_logging('info', {fmt!r}); say('serving (Ctrl-C to stop)')"
    )
    said = {}
    for fmt in ("json", "console"):
        done = subprocess.run(
            [sys.executable, "-c", code.format(fmt=fmt)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        said[fmt] = done.stderr.strip()
    assert json.loads(said["json"])["event"] == "serving (Ctrl-C to stop)"
    assert said["console"] == "reach: serving (Ctrl-C to stop)"
