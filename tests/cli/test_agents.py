"""`reach agents`: what it says about intents a coordinator refuses."""

from __future__ import annotations

from agentreach.broker import provision
from agentreach.cli.status import coordinators
from agentreach.coordinator.routing import allowances
from tests.cli.conftest import reach_argv, run
from tests.cli.test_reach_cli import worker
from tests.support import wait_for_card


async def test_no_refusals_are_shown_where_no_coordinator_enforces_allowances(broker, coordinator):
    """Allowances in KV, but a coordinator without its seal key routes every intent a card
    names: `reach agents` must not say REFUSED (it did whenever the bucket existed)."""
    await provision(broker, allowances.topology(broker.names))
    bucket = await broker.bucket(allowances.bucket_name(broker.names), allowances.Allowance)
    await bucket.put("cli-reach-worker", allowances.Allowance(agent_id="cli-reach-worker"))
    async with worker().running(broker=broker):
        await wait_for_card(broker, "cli-reach-worker", status="running")
        [status] = await coordinators(broker)
        assert status["enforces_allowances"] is False
        shown = await run(*reach_argv(broker, "agents"))
    assert shown.returncode == 0, shown.stderr
    assert "cli-reach-worker" in shown.stdout
    assert "REFUSED" not in shown.stdout
