"""The snapshot's sections, as a real coordinator's records make them."""

from __future__ import annotations

import asyncio
import json

from agentreach.agents import Agent, TaskContext
from agentreach.coordinator import workflow as wf
from tests.dashboard.test_server import dashboard, send
from tests.dashboard.token import BEARER
from tests.e2e.routing_support import fast, serving
from tests.support import until_true


async def test_a_workflow_in_flight_counts_the_steps_of_its_definition(
    broker, start_coordinator, watcher
):
    """A three-step chain at its first step is 0 of 3 steps done, not 0 of the 1 started."""
    gate = asyncio.Event()
    agent = Agent("dash-steps", startup_delay=0)

    @agent.handler("hold")
    async def hold(ctx: TaskContext, payload: dict) -> dict:
        await gate.wait()
        return {}

    flows = {"three": wf.chain(*(wf.step(name, "hold") for name in ("a", "b", "c")))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        dashboard(broker) as server,
    ):
        try:
            await broker.publish(broker.names.task("three"), b"{}", headers={"Nats-Msg-Id": "i1"})
            await watcher.event("accepted", topic="hold")

            async def in_flight() -> dict | None:
                head = [f"Host: 127.0.0.1:{server.port}", "Connection: close", BEARER]
                status, body = await send(server, "GET", "/api/snapshot", head)
                assert status == 200, body
                found = json.loads(body)["workflows"]["in_flight"]
                return next((w for w in found if w["running"] == ["a"]), None)

            shown = await until_true(in_flight)
        finally:
            gate.set()
    assert (shown["steps_done"], shown["steps_total"]) == (0, 3)
