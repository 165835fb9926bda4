"""How a reader's pause is said: a warning while connected; during an outage a debug line,
and a warning once it outlasts the outage (the connection back for STILL_PAUSED_S)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from structlog.testing import capture_logs

from agentreach.broker.pauses import STILL_PAUSED_S, Pause


def _connection(*, connected: bool, back_s_ago: float = 0.0) -> SimpleNamespace:
    """What Pause reads of a Broker: whether it is connected, and since when."""
    link = SimpleNamespace(back_at=time.monotonic() - back_s_ago)
    return SimpleNamespace(connected=connected, link=link)


def _said(pause: Pause, *steps: str) -> list[tuple[str, str]]:
    with capture_logs() as logs:
        for step in steps:
            pause.failed(OSError("no answer")) if step == "fail" else pause.ended()
    return [(e["log_level"], e["event"]) for e in logs]


def test_a_pause_while_connected_is_a_warning_and_its_end_is_said():
    pause = Pause(_connection(connected=True), "paused", "again", consumer="c")  # type: ignore[arg-type]
    assert _said(pause, "fail", "fail", "end") == [("warning", "paused"), ("info", "again")]
    assert not pause.on


def test_a_pause_in_an_outage_is_a_debug_line_unless_it_outlasts_it():
    connection = _connection(connected=False)
    pause = Pause(connection, "paused", "again")  # type: ignore[arg-type]
    assert _said(pause, "fail") == [("debug", "paused")]
    connection.connected = True  # back just now: JetStream may take a while yet
    assert _said(pause, "fail", "end") == [("debug", "again")]
    connection.connected = False
    assert _said(pause, "fail") == [("debug", "paused")]
    connection.connected = True
    connection.link.back_at = time.monotonic() - STILL_PAUSED_S - 1  # back a while ago
    said = _said(pause, "fail", "fail", "end")
    assert [level for level, _ in said] == ["warning", "info"]
    assert said[0][1].startswith("paused (still, ")
