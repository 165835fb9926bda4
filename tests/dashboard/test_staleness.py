"""The dashboard says when what it shows is not current: NATS lost, coordinators gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach.broker import Broker, EmbeddedServer, Names, Topology, provision
from agentreach.coordinator import Coordinator
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History, render
from agentreach.dashboard.history import RATE_WINDOW_MS
from agentreach.envelopes import Event, now_ms
from tests.conftest import FAST
from tests.dashboard.stream import event_stream
from tests.dashboard.test_server import send
from tests.dashboard.token import BEARER, TOKEN
from tests.secured import SECURED

own_server = pytest.mark.skipif(
    SECURED or bool(os.environ.get("NATS_URL")),
    reason="kills and restarts a nats-server of its own",
)


@contextlib.asynccontextmanager
async def killable(
    tmp_path: Path, *, coordinator: bool = True
) -> AsyncIterator[tuple[EmbeddedServer, Broker]]:
    """A nats-server this test may kill and restart, provisioned, with a coordinator
    (unless told not to)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = EmbeddedServer(port=port, store_dir=tmp_path / "nats")
    await server.__aenter__()
    try:
        url = f"nats://127.0.0.1:{port}"
        async with (
            Broker(url, names=Names(), name="test") as broker,
            Broker(url, names=Names(), name="coordinator") as own,
        ):
            await provision(broker, Topology.default(broker.names))
            if not coordinator:
                yield server, broker
                return
            async with Coordinator(own, FAST).running():
                yield server, broker
    finally:
        await server.stop()


def failed_or_done(*, done: bool) -> Event:
    """A completion, or a letter of retries exhausted (a failure for the success rate)."""
    if done:
        return Event(v=1, event="completed", message_id="m", trace_id="t", topic="x")
    detail = {"reason": "retries_exhausted"}
    return Event(v=1, event="dead_lettered", message_id="m", trace_id="t", topic="x", detail=detail)


async def snapshot(server: HttpServer) -> dict:
    head = [f"Host: 127.0.0.1:{server.port}", "Connection: close", BEARER]
    status, body = await send(server, "GET", "/api/snapshot", head)
    assert status == 200, body
    return json.loads(body)


@own_server
async def test_a_lost_nats_is_said_in_the_snapshot_and_the_stream(tmp_path: Path):
    """Kill the nats-server under a running dashboard: the snapshot, the event stream and
    `reach top` say it is not live and since when (the data is kept, as of then), /readyz
    is 503; once the server is back, it is live again, and the page gets the whole window
    again at once (its charts had a gap until the next snapshot, 5 min later)."""
    history = History(step_s=1, window_s=60, period_s=30)
    async with (
        killable(tmp_path) as (nats, broker),
        Board(broker, history, version="test") as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.2)) as server,  # type: ignore[arg-type]
        event_stream(server) as stream,
    ):
        live = (await snapshot(server))["system"]
        assert (live["connected"], live["stale_since_ms"], live["stale_why"]) == (True, None, None)
        assert len(live["replicas"]) == 1
        killed_ms = now_ms()
        await nats.kill()
        said = await stream.until("system", lambda s: s["stale_since_ms"] is not None)
        stale = (await snapshot(server))["system"]
        terminal = render(board.snapshot())
        head = [f"Host: 127.0.0.1:{server.port}", "Connection: close"]
        ready, _ = await send(server, "GET", "/readyz", head)
        await nats.restart()
        back = await stream.until("system", lambda s: s["stale_since_ms"] is None, timeout=30)
        # The whole window again at once, with what was folded meanwhile (not in 5 min).
        again = await stream.until("snapshot", lambda s: True, timeout=5)
    assert again["system"]["stale_since_ms"] is None and again["metrics"]["series"]
    assert said["connected"] is False and "lost its connection to NATS" in said["stale_why"]
    assert killed_ms - 3_000 <= said["stale_since_ms"] <= killed_ms  # the last read before
    assert stale["stale_since_ms"] == said["stale_since_ms"]
    assert stale["replicas"] == live["replicas"]  # the last state seen, flagged as such
    assert ready == 503
    assert "NOT LIVE: it lost its connection to NATS" in terminal  # `reach top` too
    assert back["connected"] is True and back["stale_why"] is None


async def test_the_replicas_do_not_vanish_while_they_are_asked_again(broker, coordinator):
    """A snapshot taken while the replicas are asked for their status (every 2 s, for
    0.3 s) still lists the one running; the list was emptied for that wait."""
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        assert len(board.system()["replicas"]) == 1
        refreshing = asyncio.create_task(board.refresh())
        seen = []
        while not refreshing.done():
            seen.append(len(board.system()["replicas"]))
            await asyncio.sleep(0.01)
        await refreshing
    assert len(seen) > 10 and set(seen) == {1}


@own_server
async def test_what_is_shown_while_not_live_stays_as_of_then(tmp_path: Path):
    """While the dashboard has lost NATS, nothing new is known: the metrics, their states
    and the alerts are those of the moment it went stale, though the clock moves on and
    the 5-minute window would slide past the completions it holds; the charts gain no
    point and no `metrics` event is sent."""
    history = History(step_s=1, window_s=60, period_s=30)
    async with (
        killable(tmp_path, coordinator=False) as (nats, broker),
        Board(broker, history, version="test") as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.2)) as server,  # type: ignore[arg-type]
        event_stream(server) as stream,
    ):
        await nats.kill()
        said = await stream.until("system", lambda s: s["stale_since_ms"] is not None)
        since = said["stale_since_ms"]
        # Completions that the 5-minute window held at `since` and slides past 1 s later.
        for i in range(5):
            history.fold(failed_or_done(done=i > 0), since - RATE_WINDOW_MS + 1_000)
        then = (await snapshot(server))["metrics"]["series"]
        # The clock moving on is what this test is about: it waits for it to pass.
        sent = await stream.during(max(0.0, (since + 2_500 - now_ms()) / 1000))
        later = (await snapshot(server))["metrics"]["series"]
        await nats.restart()
    assert then["success_rate"]["value"] == 0.8, then["success_rate"]
    assert then["success_rate"]["detail"] == "4 of 5 completed, 5 min"
    assert then["success_rate"]["state"] == "pending"  # its 2 min not yet served
    for key in then:
        assert later[key] == then[key], key  # values, states, details and points alike
        assert then[key]["points"][-1][0] <= since, key
    assert [name for name, _ in sent if name == "metrics"] == []
