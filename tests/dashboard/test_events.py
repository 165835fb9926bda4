"""The dashboard's event stream sends a section when it changed, not every tick."""

from __future__ import annotations

import copy
import json
from typing import Any

from agentreach.agents import Agent, ReachClient
from agentreach.cli.retirement import forget
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History
from agentreach.envelopes import Event, Task, now_ms
from tests.dashboard.stream import event_stream
from tests.dashboard.token import TOKEN
from tests.e2e.routing_support import serving
from tests.support import eventually, letter_of


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


def finished(kind: str) -> Event:
    detail = {"reason": "retries_exhausted"} if kind == "dead_lettered" else {}
    return Event(v=1, event=kind, message_id="m", trace_id="t", topic="x", detail=detail)


async def test_alerts_are_sent_when_the_set_changed_not_when_a_value_moved(broker):
    """A success rate firing for 200 s drops from 80 % to 67 %: the same alert fires, so no
    `alerts` event is sent (it was, each time its summary's percentage moved); the new
    value comes with the next `metrics` event, alerts and all."""
    history = History(step_s=2, window_s=240, period_s=30)
    async with (
        Board(broker, history) as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.2)) as server,  # type: ignore[arg-type]
    ):
        for kind in ["completed"] * 4 + ["dead_lettered"]:
            history.fold(finished(kind), now_ms() - 200_000)
        async with event_stream(server) as stream:
            name, snapshot = await stream.next()
            history.fold(finished("dead_lettered"), now_ms())
            sent = []
            while not sent or sent[-1][0] != "metrics":
                sent.append(await stream.next())
    assert name == "snapshot"
    (firing,) = snapshot["alerts"]
    assert firing["name"] == "ReachSuccessRateLow" and "80.00 %" in firing["summary"]
    assert [name for name, _ in sent if name == "alerts"] == []
    tick = sent[-1][1]
    assert tick["series"]["success_rate"]["value"] == 4 / 6
    assert [a["name"] for a in tick["alerts"]] == ["ReachSuccessRateLow"]
    assert "66.67 %" in tick["alerts"][0]["summary"]


async def letter(broker, message_id: str) -> None:
    task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work", payload="x" * 300)
    await letter_of(broker, task)


async def test_a_new_dead_letter_sends_that_letter_not_every_letter_again(broker):
    """60 open letters, then one more: the `dead_letters` event carries the new letter and
    the order of those shown by sequence (it carried all 110 rows, ~100 KB at each new
    letter); with the snapshot's letters, the page rebuilds what a new snapshot says."""
    for n in range(60):
        await letter(broker, f"old-{n}")
    async with (
        Board(broker, History(step_s=10, window_s=60, period_s=30)) as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.2)) as server,  # type: ignore[arg-type]
        event_stream(server) as stream,
    ):
        _, snapshot = await stream.next()
        await letter(broker, "new-1")
        sent = await stream.until("dead_letters", lambda d: d["open"] == 61)
        now = board.snapshot()["dead_letters"]
    shown = snapshot["dead_letters"]
    assert [x["message_id"] for x in sent["letters"]] == ["new-1"]
    assert len(json.dumps(sent)) < 4_000
    kept = {x["seq"]: x for x in shown["recent"] + shown["open_letters"] + sent["letters"]}
    assert [kept[seq] for seq in sent["recent_seqs"]] == now["recent"]
    assert [kept[seq] for seq in sent["open_seqs"]] == now["open_letters"]
    counts = ("total", "by_reason", "open", "open_not_shown")
    assert {k: sent[k] for k in counts} == {k: now[k] for k in counts}


async def test_no_route_of_a_topic_whose_agents_were_forgotten_counts_against_success(
    broker, coordinator, watcher
):
    """Its agent killed and forgotten, tasks of a topic it served end `no_route`: the metrics
    count them (the coordinator saw the topic served), the dashboard left them out (it asked
    only today's cards), so it showed 100 % while ReachSuccessRateLow fired."""
    history = History(step_s=1, window_s=60, period_s=30)
    async with Board(broker, history) as board, ReachClient(broker=broker) as client:
        async with serving(broker, coordinator, idle("gone-1")):
            await client.invoke("idle", {})
            await eventually(lambda: board.directory.serving("idle") and board.read_ms)
            await board.refresh()
        await forget(broker, "gone-1")
        await eventually(lambda: not board.directory.serving("idle"))
        sent = [(await client.publish("idle", {}))[0] for _ in range(2)]
        for message_id in sent:
            await watcher.dead_letter("no_route", message_id=message_id)
        await eventually(lambda: history.values(now_ms() + 1_000)["finished"] >= 3)
        counted = history.values(now_ms() + 1_000)
    assert (counted["completed"], counted["finished"]) == (1, 3)
