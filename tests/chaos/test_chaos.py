"""Reliability under faults: kill -9 an agent, kill -9 a coordinator, restart nats-server while
tasks flow, then account for every message id from the agents' own records and REACH_DLQ."""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosPlan, run_chaos


async def test_every_task_ends_once_through_agent_coordinator_and_server_faults(
    tmp_path, show_at_end
):
    """2,000 tasks and 100 two-step workflows through three faults: none lost, none run
    twice unless its agent was killed, every workflow ended."""
    plan = ChaosPlan(tasks=2_000, rate=60, work_ms=200, flows=100)
    report = await run_chaos(plan, tmp_path)
    show_at_end(report.render())
    if report.problems():
        pytest.fail(report.render(), pytrace=False)
