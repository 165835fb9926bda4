"""The dashboard's event stream sends a section when it changed, not every tick."""

from __future__ import annotations

import copy
from typing import Any

from agentreach.agents import Agent
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History
from agentreach.envelopes import now_ms
from tests.dashboard.stream import event_stream
from tests.dashboard.token import TOKEN
from tests.e2e.routing_support import serving
from tests.support import eventually


def idle(agent_id: str) -> Agent:
    agent = Agent(agent_id, startup_delay=0)

    @agent.handler("idle")
    async def handle(ctx: Any, payload: dict) -> dict:
        return {}

    return agent


def without_age(agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = copy.deepcopy(agents)
    for agent in found:
        if agent["heartbeat"]:
            agent["heartbeat"].pop("age_ms")
    return found


async def test_agents_are_sent_when_they_changed_not_as_their_heartbeats_age(broker, coordinator):
    """An agent that only grows older since its last heartbeat is not sent again each
    tick (the page counts its age on from heartbeat.seen_ms); a new agent is sent."""
    history = History(step_s=10, window_s=60, period_s=30)
    async with (
        serving(broker, coordinator, idle("steady-1")),
        Board(broker, history) as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.2)) as server,  # type: ignore[arg-type]
    ):
        await eventually(lambda: [a["state"] for a in board.snapshot()["agents"]] == ["ONLINE"])
        async with event_stream(server) as stream:
            name, snapshot = await stream.next()
            sent = [data for name, data in await stream.during(3.0) if name == "agents"]
            async with serving(broker, coordinator, idle("steady-2")):
                grown = await stream.until("agents", lambda agents: len(agents) == 2)
    assert name == "snapshot"
    assert len(sent) <= 1, sent  # a heartbeat may land in 3 s; 15 ticks passed
    before = snapshot["agents"]
    for agents in sent:  # each one sent says something new: a heartbeat, not an age
        assert without_age(agents) != without_age(before)
        before = agents
    beat = grown[0]["heartbeat"]
    assert beat["seen_ms"] <= now_ms() and beat["age_ms"] >= 0
