"""Log lines anyone can make come again and again: each kind said a few times a minute, with
how often it came meanwhile."""

from __future__ import annotations

from agentreach.logs import RepeatedLines


def test_a_line_is_due_again_after_its_interval_with_the_times_it_came_meanwhile(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("agentreach.logs.time.monotonic", lambda: now[0])
    lines = RepeatedLines(every_s=60)
    assert lines.due("a") == 0
    assert lines.due("b") == 0  # another kind has its own interval
    now[0] += 59
    assert [lines.due("a"), lines.due("a")] == [None, None]
    now[0] += 1
    assert lines.due("a") == 2
    assert lines.due("a") is None


def test_a_burst_of_lines_is_said_before_the_rest_of_its_interval_is_counted(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("agentreach.logs.time.monotonic", lambda: now[0])
    lines = RepeatedLines(every_s=60, burst=3)
    assert [lines.due("a") for _ in range(5)] == [0, 0, 0, None, None]
    now[0] += 30
    assert lines.due("a") is None  # the interval runs from the burst's first line
    now[0] += 30
    assert [lines.due("a") for _ in range(4)] == [3, 0, 0, None]


def test_the_kinds_remembered_are_bounded(monkeypatch):
    """A kind per key an attacker names (a bucket's keys) cannot grow without end."""
    lines = RepeatedLines(every_s=60)
    for key in range(1_000):
        lines.due(f"key-{key}")
    assert len(lines._kinds) == 64
    assert lines.due("key-999") is None and lines.due("key-0") == 0
