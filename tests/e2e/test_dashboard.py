"""The live dashboard in a real headless Chromium, against a running system; the screenshot
is kept as a test artifact (``artifacts/dashboard.png``, or under ``$REACH_ARTIFACTS``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from agentreach.agents import ReachClient
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History, render
from agentreach.examples.echo import agent as echo_agent
from agentreach.examples.failing import agent as failing_agent
from agentreach.examples.summarize import agent as summarizer
from tests.dashboard.test_staleness import killable, own_server
from tests.dashboard.token import TOKEN, login_url
from tests.e2e.browser import FIVE, Browser, chromium
from tests.scrape import http_get

REPO = Path(__file__).parents[2]


def _artifacts() -> Path:
    folder = Path(os.environ.get("REACH_ARTIFACTS") or REPO / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _browser() -> str:
    found = chromium()
    if found is None:
        if os.environ.get("CI") or os.environ.get("REACH_REQUIRE_CHROMIUM") == "1":
            pytest.fail("CI needs chromium (Debian: apt-get install chromium)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return found


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    try:
        writer.write(
            f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: application/json\r\n{head}\r\n".encode()
            + body
        )
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    status, _, rest_ = raw.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(rest_)


def _live(facts: dict) -> bool:
    metrics = facts.get("metrics") or {}
    return (
        facts.get("live") == "live"
        and facts.get("updates", 0) >= 2
        and all(key in metrics for key in FIVE)
        and {"summarizer-1", "failing-1", "echo-1"} <= set(facts.get("agents", []))
        and "isolated" in (facts.get("agentText") or {}).get("failing-1", "")
        and metrics["success_rate"]["value"] not in ("", None)
        and float(metrics["success_rate"]["value"]) < 1
        and facts.get("traceDrawn")
        and len(facts.get("deadLetterReasons", [])) >= 1
    )


async def test_the_dashboard_shows_a_running_system_live(broker, coordinator, watcher):
    """Chromium renders the five metrics (success below 100 % with an agent that fails every
    task), the agents with the failing one isolated, dead letters by reason, a trace drawn
    on its timeline, and applies live updates; a replay needs X-Reach-Request."""
    executable = _browser()
    async with (
        summarizer.running(broker=broker),
        failing_agent.running(broker=broker),
        echo_agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        done = [await client.publish("summarize", {"text": f"Fast. Run {i}."}) for i in range(4)]
        # five messages failing in a row isolate it (each retried: its attempts count once)
        failed = [await client.publish("unreliable", {"n": i}) for i in range(5)]
        for message_id, _ in done:
            await watcher.event("completed", message_id=message_id)
        for message_id, _ in failed:  # retries exhausted, or refused once it is isolated
            await watcher.event("dead_lettered", message_id=message_id)
        await watcher.event("agent_isolated")
        history = History(step_s=1, window_s=120, period_s=30)
        async with (
            Board(broker, history, version="test") as board,
            HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.25)) as server,  # type: ignore[arg-type]
        ):
            shot = _artifacts() / "dashboard.png"
            url = f"{login_url(server)}#trace={done[0][0]}"

            def look() -> tuple[dict, str, dict]:
                with Browser(executable, 1400, 1100) as browser:
                    session = browser.open(url)
                    facts = browser.wait_for(session, _live, timeout=40)
                    browser.screenshot(session, shot)
                    # A letter's age counts on with no new event (it stayed as first drawn).
                    first = facts.get("letterAges")
                    later = browser.wait_for(
                        session, lambda f: f.get("letterAges") not in (None, first), timeout=10
                    )
                    return facts, browser.evaluate(session, "location.href"), later

            facts, shown_at, later = await asyncio.to_thread(look)
            print(f"\ndashboard screenshot: {shot}")
            assert _live(facts), facts
            assert facts["traceId"] == done[0][1]
            assert shown_at == f"{server.url}#trace={done[0][0]}"  # the token is out of the URL
            assert facts["metrics"]["isolated_agents"]["state"] == "firing"
            assert facts["letters"] >= 3 and facts["replayButtons"] >= 3
            assert later["letterAges"] != facts["letterAges"], (facts, later)
            assert all(re.fullmatch(r"\d+ s ago", t) for t in later["letterAges"]), later
            assert facts["resolveButtons"] >= 3  # each open letter can be resolved, with a note
            # counted on by the page from each heartbeat's seen_ms
            assert all(re.fullmatch(r"\d+ s", t) for t in facts["heartbeats"].values()), facts
            assert shot.stat().st_size > 10_000

            letter = f"{server.url}api/dlq/{failed[0][0]}/replay"
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            refused, body = await _post(letter, b"{}", bearer)
            assert refused == 403 and "X-Reach-Request" in body["error"]
            accepted, body = await _post(letter, b"{}", {"X-Reach-Request": "1", **bearer})
            assert accepted == 202 and body["replay_of"] == failed[0][0]
            replayed = await watcher.event("replayed", message_id=failed[0][0])
            assert replayed.detail["replayed_as"] == body["message_id"]
            status, text = await http_get(f"{server.url}api/trace/nothing-here", headers=bearer)
            assert status == 404 and "no events" in text
            terminal = render(board.snapshot())
    assert "Success rate" in terminal and "failing-1" in terminal and "ISOLATED" in terminal


@own_server
async def test_the_page_says_it_is_not_live_when_the_dashboard_lost_nats(tmp_path: Path):
    """With no coordinator the header and a banner say so; kill the nats-server and the page turns
    stale, with a banner naming the lost connection and since when (not "Live"); once the
    server is back it is live again. The stale page is kept as dashboard-stale.png."""
    executable = _browser()
    loop = asyncio.get_running_loop()
    history = History(step_s=1, window_s=120, period_s=30)
    async with (
        killable(tmp_path, coordinator=False) as (nats, broker),
        Board(broker, history, version="test") as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.25)) as server,  # type: ignore[arg-type]
    ):
        shot = _artifacts() / "dashboard-stale.png"

        def on_loop(work: Coroutine[Any, Any, None]) -> None:
            asyncio.run_coroutine_threadsafe(work, loop).result(30)

        def look() -> tuple[dict, dict, dict]:
            with Browser(executable, 1400, 900) as browser:
                session = browser.open(login_url(server))
                # "live" comes with the stream's opening, the snapshot just after it
                live = browser.wait_for(
                    session, lambda f: f.get("live") == "live" and f.get("snapshotAt"), timeout=20
                )
                on_loop(nats.kill())
                stale = browser.wait_for(session, lambda f: f.get("live") == "stale", timeout=20)
                browser.screenshot(session, shot)
                on_loop(nats.restart())
                back = browser.wait_for(session, lambda f: f.get("live") == "live", timeout=40)
                return live, stale, back

        live, stale, back = await asyncio.to_thread(look)
    print(f"\nstale dashboard screenshot: {shot}")
    assert live["live"] == "live" and live["liveText"] == "No coordinator answers", live
    assert live["notLive"].startswith("No coordinator answers"), live
    assert live["replicasText"] == "no coordinator answers"
    assert stale["live"] == "stale", stale
    assert stale["liveText"].startswith("Not live · data as of"), stale
    assert "lost its connection to NATS" in stale["notLive"], stale
    assert "not the current one" in stale["notLive"] and stale["staleSince"], stale
    assert back["live"] == "live" and not back["staleSince"], back
    assert back["notLive"].startswith("No coordinator answers"), back  # still none
