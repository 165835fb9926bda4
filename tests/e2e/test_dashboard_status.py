"""What the page says of its own state, driven by a scripted event stream in a real
Chromium: nothing is live before a snapshot, a stale snapshot is not live, no coordinator
is said plainly; and the agents and dead letters as the stream's events leave them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Coroutine
from importlib import resources
from typing import Any

from agentreach.coordinator.observability import HttpServer
from agentreach.coordinator.observability.http import Request, Response, Streamed
from agentreach.dashboard.history import KEYS, LABELS
from agentreach.envelopes import now_ms
from tests.e2e.browser import Browser
from tests.e2e.test_dashboard import _browser

# Before the page's own script: note when its event stream opens (the page's onopen runs
# just after, in the same dispatch, so no evaluation falls between the two).
NOTE_OPEN = """{
  const Real = window.EventSource;
  window.EventSource = class extends Real {
    constructor(...args) {
      super(...args);
      this.addEventListener("open", () => { window.streamOpened = true; });
    }
  };
}"""

FACTS = """(() => {
  const html = document.documentElement, text = (id) => document.getElementById(id).textContent;
  const banner = document.getElementById("stale");
  return {
    opened: !!window.streamOpened, live: html.dataset.live, liveText: text("live-text"),
    coordinators: html.dataset.coordinators || null,
    snapshotAt: Number(html.dataset.snapshotAt || 0),
    updates: Number(html.dataset.updates || 0), banner: banner.hidden ? null : banner.textContent,
    agentsSub: text("agents-sub"),
    load: Object.fromEntries([...document.querySelectorAll("[data-agent-id]")]
      .map((el) => [el.dataset.agentId, el.querySelector("[data-load]").textContent.trim()])),
    letters: [...document.querySelectorAll("[data-message-id]")].map((el) => el.dataset.messageId),
  };
})()"""


def snapshot(*, stale: bool = False, replicas: int = 1, **sections: Any) -> dict[str, Any]:
    """A snapshot as docs/dashboard.md gives it, with nothing in it but what is asked."""
    at = now_ms()
    series = {
        key: {
            "key": key,
            "label": LABELS[key][0],
            "unit": LABELS[key][1],
            "value": None,
            "state": "no_data",
            "since_ms": None,
            "threshold": {"op": ">", "value": 0.5, "for_s": 0, "text": "", "min_completed": 0},
            "detail": "",
            "points": [],
        }
        for key in KEYS
    }
    letters = {"total": 0, "by_reason": [], "recent": [], "open": 0}
    return {
        "v": 1,
        "at_ms": at,
        "system": {
            "prefix": "reach",
            "version": "test",
            "nats": "nats://127.0.0.1:4222",
            "connected": not stale,
            "stale_since_ms": at - 40_000 if stale else None,
            "stale_why": "lost its connection to NATS (nats://127.0.0.1:4222); reconnecting"
            if stale
            else None,
            "replicas": [
                {"replica": f"r-{n}", "ready": True, "duties": []} for n in range(replicas)
            ],
            "read_only": False,
            "source": "events",
        },
        "metrics": {"step_s": 10, "window_s": 1800, "series": series},
        "alerts": [],
        "agents": [],
        "dead_letters": {**letters, "open_letters": [], "open_not_shown": 0},
        "workflows": {"by_status": {}, "in_flight": []},
        **sections,
    }


def offline_agent() -> dict[str, Any]:
    """An agent OFFLINE for a minute whose last heartbeat had 3 of 4 slots busy."""
    seen = now_ms() - 60_000
    return {
        "agent_id": "gone-1",
        "state": "OFFLINE",
        "since_ms": seen,
        "reason": "3 heartbeats missed",
        "quarantined": False,
        "isolated": False,
        "epoch": 1,
        "host": "h",
        "pid": 1,
        "tags": {},
        "intents": [],
        "heartbeat": {
            "seen_ms": seen,
            "age_ms": 60_000,
            "interval_s": 15.0,
            "in_flight": 3,
            "free_slots": 1,
            "latency_ms": 0,
        },
        "queues": {},
        "breakers": [],
    }


def letter(seq: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "message_id": f"letter-{seq}",
        "trace_id": f"letter-{seq}",
        "topic": "t",
        "reason": "no_route",
        "attempts": 1,
        "error": None,
        "at_ms": now_ms(),
        "replayable": True,
        "replayed_as": None,
        "resolved": None,
        "state": "open",
    }


class Scripted:
    """Serves the page, and an event stream that sends what the test puts in ``events``."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._page = resources.files("agentreach.dashboard").joinpath("index.html").read_bytes()

    async def __call__(self, request: Request) -> Response | Streamed:
        if request.path == "/api/events":
            return Streamed(self._stream())
        return Response(200, self._page, "text/html; charset=utf-8")

    async def _stream(self) -> AsyncIterator[bytes]:
        yield b"retry: 3000\n\n"
        while True:
            name, data = await self.events.get()
            yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


async def test_the_page_says_what_it_knows_and_no_more():
    """The stream open, no snapshot yet: "Connecting…", not Live. A snapshot saying the
    dashboard lost NATS: not live, since when. A live one without a coordinator: the header
    says no coordinator answers, not Live; an OFFLINE agent shows no load from its last
    heartbeat; an empty install no trailing separator. A dead_letters event adds its new
    letter to those the page holds."""
    executable = _browser()
    loop = asyncio.get_running_loop()
    app = Scripted()
    async with HttpServer(app) as server:  # type: ignore[arg-type]

        def send(name: str, data: Any) -> None:
            work: Coroutine[Any, Any, None] = app.events.put((name, data))
            asyncio.run_coroutine_threadsafe(work, loop).result(10)

        def look() -> list[dict[str, Any]]:
            with Browser(executable, 1200, 900) as browser:
                session = browser.open("about:blank")
                browser.call("Page.enable", session=session)
                browser.call(
                    "Page.addScriptToEvaluateOnNewDocument", {"source": NOTE_OPEN}, session=session
                )
                browser.call("Page.navigate", {"url": server.url}, session=session)
                seen = [until(browser, session, lambda f: f.get("opened"))]
                for n, sent in enumerate(
                    (
                        snapshot(stale=True),
                        snapshot(replicas=0),
                        snapshot(
                            agents=[offline_agent()],
                            dead_letters={
                                **snapshot()["dead_letters"],
                                "total": 1,
                                "open": 1,
                                "recent": [letter(1)],
                            },
                        ),
                    )
                ):
                    sent["at_ms"] += n  # each one told apart by the page's data-snapshot-at
                    send("snapshot", sent)
                    seen.append(
                        until(
                            browser, session, lambda f, at=sent["at_ms"]: f.get("snapshotAt") == at
                        )
                    )
                delta = {"total": 2, "by_reason": [], "open": 2, "open_not_shown": 0}
                send(
                    "dead_letters",
                    {**delta, "recent_seqs": [2, 1], "open_seqs": [], "letters": [letter(2)]},
                )
                seen.append(until(browser, session, lambda f: f.get("updates", 0) >= 1))
                return seen

        before, stale, alone, agents, letters = await asyncio.to_thread(look)
    assert before["live"] == "connecting" and before["liveText"] == "Connecting…", before
    assert stale["live"] == "stale" and stale["liveText"].startswith("Not live"), stale
    assert "lost its connection to NATS" in stale["banner"], stale
    assert alone["coordinators"] == "none", alone
    assert alone["liveText"].startswith("No coordinator answers"), alone
    assert "not current" in alone["banner"], alone
    assert alone["agentsSub"] == "0 registered", alone
    assert agents["coordinators"] is None and agents["liveText"] == "Live", agents
    assert agents["load"] == {"gone-1": "—"}, agents
    assert letters["letters"] == ["letter-2", "letter-1"], letters


def until(browser: Browser, session: str, check: Any, timeout: float = 20.0) -> dict[str, Any]:
    """The page's facts once ``check`` holds of them (polled, as Browser.wait_for does)."""
    facts: dict[str, Any] = {}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(RuntimeError):  # the page is still loading
            facts = browser.evaluate(session, FACTS) or {}
        if check(facts):
            return facts
        time.sleep(0.1)
    raise AssertionError(f"the page never got there: {facts}")
