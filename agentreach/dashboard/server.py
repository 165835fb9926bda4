"""The dashboard's HTTP API and page: ``GET /`` (the page), ``GET /api/snapshot``,
``GET /api/events`` (server-sent events), ``GET /api/trace/<id>``, ``POST
/api/dlq/<message_id>/replay`` and ``/resolve``, ``/healthz`` and ``/readyz``.

The page and this API are one process of their own (``reach dashboard``): any number may
run, none holds what another needs. Its defences, in the order they are checked: every
request must name this server in its ``Host`` (:mod:`.hosts`: against DNS rebinding), or it
is answered 421 and nothing else; every route but the probes asks for the access token
(:mod:`.access`: against other processes on the host), or 401; and replaying or resolving a
dead letter needs the header ``X-Reach-Request: 1``, which a page of another site cannot send
without a CORS preflight that this server never answers, and an ``Origin``, if any, naming this
server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import msgspec

from agentreach.agents.errors import LetterSettled, NothingToReplay, ReplayLimitReached
from agentreach.agents.letters import LETTERS_READ, UNCHANGED, replay, resolve
from agentreach.broker import BrokerError, read_stream
from agentreach.coordinator.observability.http import Request, Response, Streamed
from agentreach.dashboard.access import Access
from agentreach.dashboard.hosts import AllowedHosts
from agentreach.dashboard.letter_deltas import LetterDeltas
from agentreach.dashboard.trace import trace_of, waiting_in_intake
from agentreach.dashboard.views import Board
from agentreach.envelopes import DeadLetter, DecodeError, decode_dead_letter, is_token
from agentreach.errors import ReachError

SNAPSHOT_EVERY_S = 300.0  # a whole snapshot again, to correct any drift
KEEPALIVE_S = 15.0
SECTIONS = ("system", "agents", "dead_letters", "workflows", "alerts")


class DashboardApp:
    """The request handler of the dashboard. ``token``: the access token every request but
    ``/healthz`` and ``/readyz`` must carry (None: none is asked, ``--no-token``); ``hosts``:
    the ``Host`` values it answers (by default loopback names and the address a request came
    in on, with its port)."""

    def __init__(
        self,
        board: Board,
        *,
        token: str | None,
        tick_s: float = 1.0,
        hosts: AllowedHosts | None = None,
    ) -> None:
        self.board = board
        self._tick_s = tick_s
        self._hosts = hosts or AllowedHosts()
        self._access = Access(token)
        self._page = resources.files("agentreach.dashboard").joinpath("index.html").read_bytes()

    async def __call__(self, request: Request) -> Response | Streamed:
        if (why := self._hosts.refusal(request)) is not None:
            return Response.error(421, why)
        if (refused := self._access.refusal(request)) is not None:
            return refused
        path = request.path
        if request.method == "POST" and path.startswith("/api/dlq/"):
            message_id, _, action = path.removeprefix("/api/dlq/").rpartition("/")
            if action in ("replay", "resolve"):
                return await self._settle(request, message_id, action)
        if request.method not in ("GET", "HEAD"):
            return Response.error(405, f"{request.method} is not served on {path}")
        if path in ("/", "/index.html"):
            return Response(200, self._page, "text/html; charset=utf-8")
        if path == "/api/snapshot":
            return Response.of_json(self.board.snapshot())
        if path == "/api/events":
            return Streamed(self._events())
        if path.startswith("/api/trace/"):
            return await self._trace(path.removeprefix("/api/trace/"))
        if path == "/healthz":
            return Response(200, b"ok\n")
        if path == "/readyz":
            ready = self.board.ready.is_set() and self.board.broker.connected
            return Response(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        return Response.error(404, f"no {path} here")

    async def _events(self) -> AsyncIterator[bytes]:
        """A snapshot first, then each section that changed and a metrics point every step."""
        board, counter = self.board, 0

        def event(name: str, data: Any) -> bytes:
            nonlocal counter
            counter += 1
            body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            return f"id: {counter}\nevent: {name}\ndata: {body}\n\n".encode()

        snapshot = board.snapshot()
        last = {name: _compared(name, snapshot[name]) for name in SECTIONS}
        letters = LetterDeltas(snapshot["dead_letters"])
        yield b"retry: 3000\n\n" + event("snapshot", snapshot)
        loop = asyncio.get_running_loop()
        step_s = board.history.step_ms / 1000
        next_point = loop.time() + step_s
        resnapshot = loop.time() + SNAPSHOT_EVERY_S
        quiet_since = loop.time()
        stale = snapshot["system"]["stale_since_ms"] is not None
        while True:
            await asyncio.sleep(self._tick_s)
            metrics = board.metrics(full=False)
            now = {
                "system": board.system(),
                "agents": board.snapshot_section("agents"),
                "dead_letters": board.snapshot_section("dead_letters"),
                "workflows": board.snapshot_section("workflows"),
                "alerts": board.alerts(metrics),
            }
            sent = False
            if loop.time() >= resnapshot:
                resnapshot = loop.time() + SNAPSHOT_EVERY_S
                snapshot = board.snapshot()
                letters = LetterDeltas(snapshot["dead_letters"])
                yield event("snapshot", snapshot)
                continue
            for name, value in now.items():
                text = _compared(name, value)
                if text != last[name]:
                    last[name] = text
                    yield event(name, letters.delta(value) if name == "dead_letters" else value)
                    sent = True
            was_stale, stale = stale, now["system"]["stale_since_ms"] is not None
            if was_stale and not stale:
                # Live again: the events stored meanwhile are folded into points the page
                # never got (it had a gap until the next snapshot, 5 min): one at the next tick.
                resnapshot = loop.time()
            if loop.time() >= next_point:
                next_point += step_s
                # While not live the metrics are as of then: a point would repeat the last.
                if now["system"]["stale_since_ms"] is None:
                    tick = {"at_ms": metrics["at_ms"], "series": metrics["series"]}
                    yield event("metrics", {**tick, "alerts": now["alerts"]})
                    sent = True
            if sent:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= KEEPALIVE_S:
                quiet_since = loop.time()
                yield b": keepalive\n\n"

    async def _trace(self, some_id: str) -> Response:
        if not is_token(some_id):
            return Response.error(400, f"{some_id!r} is not a message id or trace id")
        broker = self.board.broker
        try:
            found = await asyncio.wait_for(trace_of(broker, some_id), 5)
            if found is None:  # maybe a task that waits in the intake, not routed yet
                running = bool(self.board.replicas)  # as the last refresh found them
                waiting = waiting_in_intake(broker, some_id, coordinator_runs=running)
                found = await asyncio.wait_for(waiting, 5)
        except (BrokerError, TimeoutError) as exc:
            return Response.error(503, f"cannot read REACH_EVENTS now: {exc}")
        if found is None:
            return Response.error(
                404,
                f"no events for {some_id!r} in REACH_EVENTS (kept 7 days), nor a task of"
                " that id waiting in the intake",
            )
        return Response.of_json(found)

    async def _settle(self, request: Request, message_id: str, action: str) -> Response:
        """Replay a dead letter, or record it resolved: a change, so asked for on purpose
        (the header), from this page (the origin), as JSON (no form of another site)."""
        if request.headers.get("x-reach-request") != "1":
            return Response.error(403, f"{action} needs the header X-Reach-Request: 1")
        if self.board.read_only:
            return Response.error(403, "this dashboard is read-only (--read-only)")
        origin, host = request.headers.get("origin"), request.headers.get("host", "")
        if origin and origin.split("://", 1)[-1] != host:
            return Response.error(403, f"requests from {origin} are not accepted")
        if (why := _not_json(request)) is not None:
            return Response.error(415, why)
        kind, shape = (_ReplayBody, "{topic?, ttl_ms?, force?}")
        if action == "resolve":
            kind, shape = (_ResolveBody, '{"note": "how it was dealt with"}')
        try:
            options = msgspec.convert(request.json(), kind)
        except (ValueError, msgspec.ValidationError) as exc:
            return Response.error(400, f"the body must be {shape} JSON: {exc}")
        letter = await self._letter(message_id)
        if letter is None:
            return Response.error(404, f"no dead letter {message_id!r} in REACH_DLQ")
        if isinstance(options, _ResolveBody):
            return await self._resolve(letter, options.note)
        return await self._replay(letter, options)

    async def _resolve(self, letter: DeadLetter, note: str) -> Response:
        if not note.strip():
            return Response.error(400, "a resolution needs a note: how the letter was dealt with")
        # As `reach dlq resolve` and a replay from here record it: the operator's identity.
        by = self.board.broker.auth.identity or "operator"
        try:
            await resolve(self.board.broker, letter, note, by=by)
        except ReachError as exc:
            return Response.error(503, str(exc))
        return Response.of_json(
            {"message_id": letter.message_id, "state": "resolved", "by": by}, 202
        )

    async def _replay(self, letter: DeadLetter, options: _ReplayBody) -> Response:
        message_id = letter.message_id
        try:
            task = await replay(
                self.board.broker,
                letter,
                topic=options.topic,
                ttl_ms=options.ttl_ms,
                payload=UNCHANGED if options.payload is msgspec.UNSET else options.payload,
                force=options.force,
            )
        except NothingToReplay:
            return Response.error(
                409,
                f"{message_id} ({letter.reason}) has no decodable task to replay: send the"
                ' payload it should have had, {"payload": ...} (and "topic" when its topic is'
                " not known)",
            )
        except (ReplayLimitReached, LetterSettled) as exc:
            return Response.error(409, f'{exc}; send {{"force": true}} to replay it anyway')
        except ReachError as exc:
            return Response.error(503, str(exc))
        self.board.replayed[message_id] = task.message_id
        reply = {
            "message_id": task.message_id,
            "trace_id": task.trace_id,
            "topic": task.topic,
            "replay_of": message_id,
        }
        return Response.of_json(reply, 202)

    async def _letter(self, message_id: str) -> Any:
        names = self.board.broker.names
        for stored in reversed(
            await read_stream(
                self.board.broker, names.dlq_stream, names.dlq_wildcard, limit=LETTERS_READ
            )
        ):
            try:
                letter = decode_dead_letter(stored.data, stored.headers, stored=True)
            except DecodeError:
                continue
            if letter.message_id == message_id:
                return letter
        return None


def _compared(name: str, section: Any) -> str:
    """What must differ for ``section`` to be sent again. An agent's heartbeat ages at every
    tick without anything changing: the page counts the age on from ``seen_ms`` itself. An
    alert's summary moves with its value, which each ``metrics`` event carries: the alerts
    are sent when one began or stopped firing."""
    if name == "alerts":
        section = sorted((a["name"], a["metric"], a["severity"]) for a in section)
    if name == "agents":
        section = [
            {**agent, "heartbeat": agent["heartbeat"] and {**agent["heartbeat"], "age_ms": 0}}
            for agent in section
        ]
    return json.dumps(section)


def _not_json(request: Request) -> str | None:
    """Why the body of ``request`` is not taken as JSON; None when it is (or there is none).
    A page of another site may POST text/plain without asking first: never read as JSON."""
    if not request.body.strip():
        return None
    given = request.headers.get("content-type")
    if given is not None and given.split(";", 1)[0].strip().lower() == "application/json":
        return None
    return (
        "the body must be JSON, sent with Content-Type: application/json"
        f" (this one's is {given or 'not given'})"
    )


class _ResolveBody(msgspec.Struct, forbid_unknown_fields=True):
    note: str


class _ReplayBody(msgspec.Struct, forbid_unknown_fields=True):
    topic: str | None = None
    ttl_ms: int | None = None
    payload: Any = msgspec.UNSET  # instead of the task's own (null is a payload too)
    force: bool = False  # replay a settled letter, or one past the replay limit
