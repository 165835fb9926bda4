"""A message sent again under its id (the safe retry) while no coordinator runs, on a
secured server, where a caller hears how its messages went from the coordinator alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentreach.agents import NotAcknowledged, ReachClient
from agentreach.broker import Broker, Topology, provision
from tests.secured import SecuredDeployment, secured_server


async def test_an_invoke_again_while_no_coordinator_runs_says_so_and_that_it_stays_queued(
    tmp_path: Path,
) -> None:
    """The second invoke under the id finds it taken in (a duplicate), asks the coordinator
    how it went, and nobody answers: NotAcknowledged, saying no coordinator runs and that
    the task stays queued. It raised the broker's NoResponders, which reads as "not sent"
    and invites a resend under a new id (the task then ran twice)."""
    deployment = SecuredDeployment(tmp_path / "auth")
    async with (
        secured_server(deployment, tmp_path / "server") as server,
        Broker(server.url, name="admin", auth=deployment.admin) as admin,
    ):
        await provision(admin, Topology.default(admin.names))
        async with ReachClient(server.url, auth=deployment.auth("caller", "trickle")) as client:
            await client.publish("work", {"n": 1}, message_id="tr-1")
            with pytest.raises(NotAcknowledged) as again:
                await client.invoke(
                    "work",
                    {"n": 1},
                    message_id="tr-1",
                    ack_deadline_ms=200,
                    execute_deadline_ms=300,
                )
    assert "no coordinator is running" in str(again.value)
    assert "invoke again with message_id='tr-1'" in str(again.value)
    assert again.value.message_id == "tr-1"


async def test_an_invoke_again_with_no_coordinator_says_so_on_any_server(broker) -> None:
    """On the test's server (open, or secured as an operator reading the events itself):
    the same, after the wait (it raised DeadlineExceeded, "did not end", which says nothing
    of why and reads as if an agent had it)."""
    async with ReachClient(broker=broker, name="trickle") as client:
        await client.publish("work", {"n": 1}, message_id="tr-2")
        with pytest.raises(NotAcknowledged, match="no coordinator is running") as again:
            await client.invoke(
                "work", {"n": 1}, message_id="tr-2", ack_deadline_ms=200, execute_deadline_ms=300
            )
    assert again.value.message_id == "tr-2"
