"""`reach dashboard` run as a user runs it: a mistake on its command line is one line."""

from __future__ import annotations

import pytest

from tests.cli.conftest import reach_argv, run


@pytest.mark.parametrize("port", ["70000", "-1"])
async def test_a_port_out_of_range_is_one_line_not_a_traceback(broker, port: str):
    """`--port 70000` is refused before anything starts, like `--metrics-port 70000` of
    `reach coordinator`, with the range it takes; no OverflowError from bind()."""
    done = await run(*reach_argv(broker, "dashboard", "--port", port), timeout=20)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"reach: error: --port takes 0-65535 (0: any free one); got {port}"
    ], done.stderr
