"""The dashboard's HTTP server answers only requests that name it in their Host: DNS
rebinding gets a page of another site no further than a 421."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from agentreach.broker import Broker
from agentreach.broker.dead_letters import dead_letter
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import AllowedHosts, Board, DashboardApp, History
from agentreach.envelopes import ErrorInfo, Task, encode
from agentreach.envelopes.headers import task_headers
from tests.dashboard.token import BEARER, TOKEN
from tests.scrape import http_request
from tests.support import Watcher


@contextlib.asynccontextmanager
async def dashboard(
    broker: Broker, *extra: str, token: str | None = TOKEN
) -> AsyncIterator[HttpServer]:
    """A dashboard answering the ``extra`` Host names too, asking for ``token``."""
    history = History(step_s=1, window_s=60, period_s=30)
    async with Board(broker, history, version="test") as board:
        app = DashboardApp(board, token=token, hosts=AllowedHosts(extra))
        async with HttpServer(app) as server:  # type: ignore[arg-type]
            yield server


async def send(
    server: HttpServer, method: str, path: str, head: list[str], body: bytes = b""
) -> tuple[int, str]:
    """``(status, body)`` of a request with exactly the header lines ``head`` (no Host of
    its own), as a browser misled by DNS would send it."""
    return await http_request("127.0.0.1", server.port, f"{method} {path}", head, body)


async def test_a_foreign_host_is_refused_on_every_route_and_replays_nothing(
    broker: Broker, watcher: Watcher
):
    """Host and Origin of another site (the reviewer's rebinding request): 421 on the page,
    the snapshot, the events, a trace, health, and a replay that would otherwise be taken
    (the same request naming 127.0.0.1 is: 202), with a body that says how to allow a name;
    the Host is judged first, with the token or without it."""
    task = Task(v=1, message_id="rebind-1", trace_id="rebind-1", topic="work")
    error = ErrorInfo(type="Boom", message="x", retryable=True)
    await dead_letter(
        broker,
        reason="retries_exhausted",
        task=task,
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
        error=error,
    )
    async with dashboard(broker) as server:
        evil = f"evil.example:{server.port}"
        replay = ("POST", "/api/dlq/rebind-1/replay")
        for method, path in (
            ("GET", "/"),
            ("GET", "/api/snapshot"),
            ("GET", "/api/events"),
            ("GET", "/api/trace/rebind-1"),
            ("GET", "/healthz"),
            replay,
        ):
            for token in ([BEARER], []):
                head = [f"Host: {evil}", f"Origin: http://{evil}", "X-Reach-Request: 1", *token]
                status, body = await send(server, method, path, head, b"{}")
                assert status == 421, (path, body)
                error_text = json.loads(body)["error"]
                assert repr(evil) in error_text and "--allow-host NAME" in error_text
                assert f"127.0.0.1:{server.port}" in error_text
        ours = f"127.0.0.1:{server.port}"
        head = [f"Host: {ours}", f"Origin: http://{ours}", "X-Reach-Request: 1", BEARER]
        head.append("Content-Type: application/json")
        status, body = await send(server, *replay, head, b"{}")
        assert status == 202, body
        await watcher.event("replayed", message_id="rebind-1")
    assert watcher.count("replayed") == 1  # the refused one replayed nothing


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("localhost:{port}", 200),
        ("LocalHost:{port}", 200),
        ("[::1]:{port}", 200),
        ("dash.example.com", 200),  # allowed on any port
        ("dash.example.com:{port}", 200),
        ("box:8443", 200),  # allowed on that port only
        ("box:{port}", 421),
        ("localhost", 200),  # without a port (a browser's default one, or a client's habit)
        ("127.0.0.1", 200),
        ("[::1]", 200),
        ("box", 200),
        ("evil.example", 421),
        ("127.0.0.1.evil.example", 421),
        ("localhost:1", 421),
        ("127.0.0.1.evil.example:{port}", 421),
        ("localhost:{port}@evil.example", 421),
        ("", 421),
    ],
)
async def test_loopback_the_served_address_and_allowed_names_are_answered(
    broker: Broker, host: str, status: int
):
    """Loopback names and the address served on, with its port; names the operator
    allowed (NAME: any port, NAME:PORT: that one); any of them without a port; nothing
    else, a missing Host neither."""
    async with dashboard(broker, "dash.example.com", "box:8443") as server:
        head = [f"Host: {host.format(port=server.port)}"] if host else []
        got, body = await send(server, "GET", "/api/snapshot", [*head, BEARER])
    assert got == status, body


async def test_two_host_headers_are_a_bad_request(broker: Broker):
    """Which Host a proxy in front read is unknown: a request with two is refused."""
    async with dashboard(broker) as server:
        ours = f"127.0.0.1:{server.port}"
        status, body = await send(server, "GET", "/healthz", [f"Host: {ours}", "Host: evil"])
    assert status == 400 and "Host" in body


def test_a_malformed_allowed_name_is_refused_when_built():
    """A name that no Host could carry is a configuration mistake, said at once."""
    with pytest.raises(ValueError, match="--allow-host 'a b'"):
        AllowedHosts(["a b"])
    assert AllowedHosts(["::1", "Box:8443"]).extra[1].name == "box"


async def test_a_task_waiting_in_the_intake_is_found_by_the_trace_lookup(broker: Broker):
    """No coordinator took it in, so no event of it is recorded: the lookup shows it stored
    in the intake, not routed yet, as `reach trace` does (it answered 404, as for an id
    nobody sent: an outside operator trial); an id nobody sent is still 404."""
    names = broker.names
    task = Task(v=1, message_id="waits-1", trace_id="wait-trace", topic="slow")
    await broker.publish(names.task("slow"), encode(task), headers=task_headers(task))
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", BEARER]
        status, body = await send(server, "GET", "/api/trace/wait-trace", ours)
        missing, said = await send(server, "GET", "/api/trace/nobody-sent-this", ours)
    assert status == 200, body
    [message] = json.loads(body)["messages"]
    assert (message["message_id"], message["status"], message["ended_ms"]) == (
        "waits-1",
        "waiting",
        None,
    )
    [stage] = message["stages"]
    assert stage["event"] == "received"
    assert "not routed yet: no coordinator runs" in stage["note"]
    assert missing == 404 and "nor a task of that id waiting in the intake" in said
