"""The dashboard's access token in a real headless Chromium: the printed URL's token becomes
a cookie and leaves the address bar, and a page whose token a restart replaced says so
(screenshot: ``artifacts/dashboard-denied.png``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from typing import Any

from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History
from tests.dashboard.token import TOKEN, login_url
from tests.e2e.browser import Browser
from tests.e2e.test_dashboard import _artifacts, _browser

OTHER = "the-token-of-the-restarted-dashboard"


def _shown(facts: dict) -> bool:
    return facts.get("live") == "live" and bool(facts.get("snapshotAt"))


def _text(browser: Browser, session: str, timeout: float = 10.0) -> str:
    """The text of the page once it has any (a 401 is a JSON body, not the dashboard)."""
    deadline = time.monotonic() + timeout
    while not (text := browser.evaluate(session, "document.body ? document.body.innerText : ''")):
        if time.monotonic() > deadline:
            return ""
        time.sleep(0.1)
    return text


async def test_the_token_of_the_url_becomes_a_cookie_and_a_replaced_one_is_said(broker):
    """Without the token Chromium gets the 401 and its message; with the printed URL the page
    is live, its address has lost the token, and its scripts cannot read the cookie. Restarted
    with another token, the dashboard refuses the page's cookie: the page says "No access"
    and how to get in, instead of reconnecting forever. The new URL makes it live again."""
    executable = _browser()
    loop = asyncio.get_running_loop()
    history = History(step_s=1, window_s=60, period_s=30)
    async with Board(broker, history, version="test") as board:
        first = HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.25))  # type: ignore[arg-type]
        await first.__aenter__()
        second = HttpServer(
            DashboardApp(board, token=OTHER, tick_s=0.25),  # type: ignore[arg-type]
            port=first.port,
        )

        running = [first]  # what the block must stop

        async def restart() -> None:
            await running.pop().__aexit__(None, None, None)
            running.append(await second.__aenter__())

        def on_loop(work: Coroutine[Any, Any, None]) -> None:
            asyncio.run_coroutine_threadsafe(work, loop).result(30)

        def look() -> tuple[str, dict, str, str, dict, dict]:
            with Browser(executable, 1200, 800) as browser:
                refused = _text(browser, browser.open(first.url))
                session = browser.open(login_url(first))
                live = browser.wait_for(session, _shown)
                at = browser.evaluate(session, "location.href")
                cookie = browser.evaluate(session, "document.cookie")
                on_loop(restart())
                denied = browser.wait_for(session, lambda f: f.get("live") == "denied")
                browser.screenshot(session, _artifacts() / "dashboard-denied.png")
                again = browser.wait_for(browser.open(login_url(second, OTHER)), _shown)
                return refused, live, at, cookie, denied, again

        try:
            refused, live, at, cookie, denied, again = await asyncio.to_thread(look)
        finally:
            for server in running:
                await server.__aexit__(None, None, None)
    assert json.loads(refused)["error"].startswith("this dashboard needs its access token")
    assert _shown(live), live
    assert at == first.url  # the token left the address bar (and the history)
    assert cookie == ""  # HttpOnly: no script of the page reads it
    assert denied["live"] == "denied", denied
    assert denied["notLive"].startswith("No access: the token given is not this dashboard's")
    assert "?token=" in denied["notLive"], denied
    assert _shown(again), again
