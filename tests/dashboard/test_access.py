"""The dashboard's access token: every route but the probes asks for it, as a cookie the
page's ``?token=`` set, or as ``Authorization: Bearer``; without it, 401 and nothing done."""

from __future__ import annotations

import json

import pytest

from agentreach.broker import Broker
from agentreach.broker.dead_letters import dead_letter
from agentreach.coordinator.observability import HttpServer
from agentreach.envelopes import Task
from tests.dashboard.stream import event_stream
from tests.dashboard.test_server import dashboard, send
from tests.dashboard.token import BEARER, TOKEN
from tests.scrape import http_exchange
from tests.support import Watcher

EVERY_ROUTE = (
    ("GET", "/"),
    ("GET", "/index.html"),
    ("HEAD", "/"),
    ("GET", "/api/snapshot"),
    ("GET", "/api/events"),
    ("GET", "/api/trace/some-id"),
    ("GET", "/no-such-page"),
    ("POST", "/api/dlq/kept-1/replay"),
)


async def _letter(broker: Broker, message_id: str, *, replays: int = 0) -> None:
    task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work", replays=replays)
    await dead_letter(
        broker,
        reason="no_route",
        task=task,
        message_id=message_id,
        trace_id=message_id,
        topic="work",
    )


def _head(server: HttpServer, *extra: str) -> list[str]:
    """What a well-formed replay carries, but for the token: the page's own headers."""
    ours = f"127.0.0.1:{server.port}"
    return [
        f"Host: {ours}",
        f"Origin: http://{ours}",
        "X-Reach-Request: 1",
        "Content-Type: application/json",
        "Connection: close",
        *extra,
    ]


async def test_without_the_token_every_route_but_the_probes_is_refused(
    broker: Broker, watcher: Watcher
):
    """No token: 401 on the page, the API, the event stream, an unknown path and a forced
    replay to a topic of the sender's choosing (the red-team's request), with a JSON error
    saying how to get in, and nothing replayed. The same replay with the token is taken:
    only the token was missing (one connection's events arrive in order, so a replay of the
    refused request would have been seen first)."""
    await _letter(broker, "kept-1", replays=3)
    forced = b'{"force": true, "topic": "chosen_by_them"}'
    async with dashboard(broker) as server:
        refused = {
            (method, path): await http_exchange(
                "127.0.0.1", server.port, f"{method} {path}", _head(server), forced
            )
            for method, path in EVERY_ROUTE
        }
        replay = ("POST", "/api/dlq/kept-1/replay")
        taken = await send(server, *replay, _head(server, BEARER), forced)
        await watcher.event("replayed", message_id="kept-1")
    for route, (status, headers, body) in refused.items():
        assert status == 401, (route, body)
        assert headers["www-authenticate"] == 'Bearer realm="reach dashboard"', route
        if route[0] != "HEAD":
            error = json.loads(body)["error"]
            assert error.startswith("this dashboard needs its access token:"), error
            assert "?token=" in error and "Authorization: Bearer" in error, error
            assert "--access-token-file" in error, error
    assert taken[0] == 202, taken
    assert watcher.count("replayed") == 1
    (replayed,) = [e for e in watcher.events if e.event == "replayed"]
    assert replayed.message_id == "kept-1"


async def test_the_probes_need_no_token(broker: Broker):
    """/healthz and /readyz answer without a token (probes show nothing, and cannot log in)."""
    async with dashboard(broker) as server:
        head = [f"Host: 127.0.0.1:{server.port}", "Connection: close"]
        health = await send(server, "GET", "/healthz", head)
        ready = await send(server, "GET", "/readyz", head)
    assert health == (200, "ok\n")
    assert ready[0] in (200, 503) and "ready" in ready[1]  # ready or not: never 401


WRONG = "the token given is not this dashboard's"
NONE = "this dashboard needs its access token"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("Authorization: Bearer not-the-token-at-all", WRONG),
        (f"Authorization: Bearer {TOKEN[:-1]}", WRONG),  # all but its last character
        (f"Authorization: Bearer {TOKEN}x", WRONG),
        ("Cookie: reach_dashboard_{port}=not-the-token-at-all", WRONG),
        (f"Authorization: Basic {TOKEN}", NONE),  # another scheme: no token given
        (f"Cookie: reach_dashboard_1={TOKEN}", NONE),  # the cookie of another port's dashboard
    ],
    # Ids without the random token: every process collecting the tests names them alike.
    ids=["other", "truncated", "extended", "other-cookie", "basic", "cookie-of-port-1"],
)
async def test_a_wrong_token_is_refused(broker: Broker, given: str, said: str):
    """A token that is not this dashboard's: 401 on the API, saying a restart makes a new
    token; the token in another scheme, or in a cookie named for another port, is none."""
    async with dashboard(broker) as server:
        head = [f"Host: 127.0.0.1:{server.port}", given.replace("{port}", str(server.port))]
        status, body = await send(server, "GET", "/api/snapshot", head)
    assert status == 401, body
    assert json.loads(body)["error"].startswith(said), body


async def test_a_wrong_token_in_the_page_url_is_refused(broker: Broker):
    """``/?token=`` with another token sets no cookie: 401, as for the API."""
    async with dashboard(broker) as server:
        status, headers, body = await http_exchange(
            "127.0.0.1", server.port, "GET /?token=guessed-it", [f"Host: 127.0.0.1:{server.port}"]
        )
    assert status == 401 and "set-cookie" not in headers
    assert json.loads(body)["error"].startswith(WRONG)


async def test_the_page_trades_its_token_for_a_cookie_and_drops_it_from_the_url(broker: Broker):
    """``/?token=T`` answers 303 to the same URL without the token (other parameters kept),
    setting an HttpOnly, SameSite=Strict cookie named for the port, which then opens the page
    and the API. The API takes no ``?token=`` itself: it would end up in logs."""
    async with dashboard(broker) as server:
        host = f"Host: 127.0.0.1:{server.port}"
        status, headers, _ = await http_exchange(
            "127.0.0.1", server.port, f"GET /?view=all&token={TOKEN}", [host]
        )
        cookie = headers["set-cookie"].split(";", 1)[0]
        page = await send(server, "GET", "/", [host, f"Cookie: other=1; {cookie}"])
        snapshot = await send(server, "GET", "/api/snapshot", [host, f"Cookie: {cookie}"])
        in_query = await send(server, "GET", f"/api/snapshot?token={TOKEN}", [host])
    assert status == 303
    assert headers["location"] == "/?view=all"
    assert headers["set-cookie"] == (
        f"reach_dashboard_{server.port}={TOKEN}; Path=/; HttpOnly; SameSite=Strict"
    )
    assert page[0] == 200 and "<html" in page[1]
    assert snapshot[0] == 200 and json.loads(snapshot[1])["v"] == 1
    assert in_query[0] == 401


async def test_a_bearer_token_opens_the_api_and_the_event_stream(broker: Broker):
    """``Authorization: Bearer <token>`` (any case of the scheme) is enough for API clients."""
    async with dashboard(broker) as server:
        host = f"Host: 127.0.0.1:{server.port}"
        snapshot = await send(server, "GET", "/api/snapshot", [host, BEARER])
        lower = await send(server, "GET", "/api/snapshot", [host, f"authorization: bearer {TOKEN}"])
        async with event_stream(server) as stream:  # it sends BEARER
            first, data = await stream.next()
    assert snapshot[0] == 200 and lower[0] == 200
    assert first == "snapshot" and data["v"] == 1


async def test_without_a_token_asked_every_route_is_open(broker: Broker):
    """A dashboard asking no token (``--no-token``) answers the API and the page without one;
    its other defences stay: the replay still needs X-Reach-Request."""
    await _letter(broker, "open-1")
    async with dashboard(broker, token=None) as server:
        host = f"Host: 127.0.0.1:{server.port}"
        snapshot = await send(server, "GET", "/api/snapshot", [host])
        page = await send(server, "GET", "/", [host])
        replay = await send(server, "POST", "/api/dlq/open-1/replay", [host])
    assert snapshot[0] == 200 and page[0] == 200
    assert replay[0] == 403 and "X-Reach-Request" in replay[1]
