"""Failover on a real 3-node JetStream cluster (three nats-server processes on loopback):
kill -9 the node leading REACH_TASKS under steady load, start it again later, and account for
every task from the agents' own records and REACH_DLQ."""

from __future__ import annotations

import pytest

from tests.cluster.failover import FailoverPlan, run_failover


async def test_killing_the_tasks_leader_loses_nothing(tmp_path, show_report):
    """1,200 tasks; the REACH_TASKS leader killed -9 after 400 and back 12 s later: every task
    completes once (or is dead-lettered with a reason), and the flow comes back within
    seconds of the last election."""
    report = await run_failover(FailoverPlan(), tmp_path, say=print)
    show_report(report.render())
    if report.problems():
        pytest.fail(report.render(), pytrace=False)


async def test_killing_the_tasks_leader_and_a_coordinator_loses_nothing(tmp_path, show_report):
    """The same with a coordinator replica killed -9 at the same moment (the one not on the
    dead node, so the replica left must reconnect and take all the work): nothing lost."""
    plan = FailoverPlan(kill_coordinator=True)
    report = await run_failover(plan, tmp_path, say=print)
    show_report(report.render())
    if report.problems():
        pytest.fail(report.render(), pytrace=False)
