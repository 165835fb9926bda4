"""The dashboard's replay endpoint: what a request must carry to replay a dead letter."""

from __future__ import annotations

import json

from agentreach.agents.letters import replay, resolve
from agentreach.broker import Broker, read_stream
from agentreach.broker.dead_letters import dead_letter
from agentreach.envelopes import ErrorInfo, Task, decode_task
from tests.dashboard.test_server import dashboard, send
from tests.dashboard.token import BEARER
from tests.support import Watcher


async def test_a_replay_body_must_be_sent_as_json(broker: Broker, watcher: Watcher):
    """A body sent as anything but application/json is refused with 415 and replays
    nothing; as JSON (with a charset, or no body at all) it is taken."""
    for message_id in ("typed-1", "typed-2"):
        task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work")
        await dead_letter(
            broker,
            reason="retries_exhausted",
            task=task,
            message_id=message_id,
            trace_id=message_id,
            topic="work",
            error=ErrorInfo(type="Boom", message="x", retryable=True),
        )
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", "X-Reach-Request: 1", "Connection: close", BEARER]
        replay = ("POST", "/api/dlq/typed-1/replay")
        refused = {}
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            typed = [f"Content-Type: {content_type}"] if content_type else []
            refused[content_type] = await send(server, *replay, [*ours, *typed], b"{}")
        as_json = ["Content-Type: application/json; charset=utf-8"]
        taken = await send(server, *replay, [*ours, *as_json], b'{"ttl_ms": 5000}')
        bare = await send(server, "POST", "/api/dlq/typed-2/replay", ours)
        await watcher.event("replayed", message_id="typed-1")
        await watcher.event("replayed", message_id="typed-2")
    for content_type, (status, body) in refused.items():
        assert status == 415, (content_type, body)
        assert json.loads(body)["error"] == (
            f"the body must be JSON, sent with Content-Type: application/json"
            f" (this one's is {content_type or 'not given'})"
        )
    assert taken[0] == 202, taken
    assert bare[0] == 202, bare
    assert watcher.count("replayed") == 2


async def test_a_letter_replayed_three_times_is_replayed_only_when_forced(
    broker: Broker, watcher: Watcher
):
    """A letter whose task 3 replays led to: 409 naming the letter, the count and how to
    force it, nothing replayed; with ``{"force": true}`` it is replayed."""
    task = Task(v=1, message_id="often-1", trace_id="often", topic="work", replays=3)
    await dead_letter(
        broker,
        reason="no_route",
        task=task,
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
    )
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", "X-Reach-Request: 1", "Connection: close", BEARER]
        ours.append("Content-Type: application/json")
        replay = ("POST", "/api/dlq/often-1/replay")
        refused = await send(server, *replay, ours, b"{}")
        forced = await send(server, *replay, ours, b'{"force": true}')
        await watcher.event("replayed", message_id="often-1")
    assert refused[0] == 409, refused
    error = json.loads(refused[1])["error"]
    assert "often-1" in error and "replayed 3 times" in error and '"force": true' in error
    assert forced[0] == 202, forced
    assert watcher.count("replayed") == 1


async def test_a_settled_letter_is_replayed_only_when_forced(broker: Broker, watcher: Watcher):
    """A letter replayed once already, and one resolved: 409 naming the letter and its
    state, nothing replayed; with ``{"force": true}`` each is replayed."""
    letters = {}
    for message_id in ("settled-1", "settled-2"):
        task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work")
        letters[message_id] = await dead_letter(
            broker,
            reason="no_route",
            task=task,
            message_id=message_id,
            trace_id=message_id,
            topic="work",
        )
    await replay(broker, letters["settled-1"])
    await resolve(broker, letters["settled-2"], "paid back", by="alice")
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", "X-Reach-Request: 1", "Connection: close", BEARER]
        ours.append("Content-Type: application/json")
        answers = {}
        for message_id in letters:
            path = ("POST", f"/api/dlq/{message_id}/replay")
            answers[message_id] = (
                await send(server, *path, ours, b"{}"),
                await send(server, *path, ours, b'{"force": true}'),
            )
        await watcher.event("replayed", message_id="settled-2")
    for message_id, state in (("settled-1", "replayed"), ("settled-2", "resolved")):
        refused, forced = answers[message_id]
        assert refused[0] == 409, refused
        error = json.loads(refused[1])["error"]
        assert f"{message_id} (no_route, topic work) not replayed: it is {state} already" in error
        assert error.endswith('send {"force": true} to replay it anyway')
        assert forced[0] == 202, forced
    assert watcher.count("replayed", {"settled-1"}) == 2
    assert watcher.count("replayed", {"settled-2"}) == 1


async def test_a_letter_is_resolved_with_a_note_as_reach_dlq_resolve_does(
    broker: Broker, watcher: Watcher
):
    """The page could replay a letter but not mark it dealt with (405): POST …/resolve with a
    note records `resolved` by the dashboard's identity; without a note, or the header,
    nothing is recorded."""
    task = Task(v=1, message_id="settle-me", trace_id="settle-me", topic="work")
    await dead_letter(broker, reason="no_route", task=task, **_ids(task))
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", "Connection: close", BEARER]
        ours.append("Content-Type: application/json")
        resolve_it = ("POST", "/api/dlq/settle-me/resolve")
        unasked = await send(server, *resolve_it, ours, b'{"note": "refunded"}')
        ours.append("X-Reach-Request: 1")
        noteless = await send(server, *resolve_it, ours, b'{"note": " "}')
        shapeless = await send(server, *resolve_it, ours, b"{}")
        unknown = await send(server, "POST", "/api/dlq/nobody/resolve", ours, b'{"note": "x"}')
        done = await send(server, *resolve_it, ours, b'{"note": "refunded by hand"}')
        resolved = await watcher.event("resolved", message_id="settle-me")
    assert unasked[0] == 403 and noteless[0] == 400 and shapeless[0] == 400, (unasked, noteless)
    assert "a resolution needs a note" in json.loads(noteless[1])["error"]
    assert '{"note": "how it was dealt with"}' in json.loads(shapeless[1])["error"]
    assert unknown[0] == 404, unknown
    assert done[0] == 202, done
    assert json.loads(done[1])["state"] == "resolved"
    assert resolved.detail["note"] == "refunded by hand"
    # By the operator, as the CLI's and a replay from the page record it (it said `dashboard`).
    assert resolved.detail["by"] == (broker.auth.identity or "operator")
    assert watcher.count("resolved") == 1


def _ids(task: Task) -> dict[str, str]:
    return {"message_id": task.message_id, "trace_id": task.trace_id, "topic": task.topic}


async def test_a_letter_without_a_task_is_replayed_with_the_payload_sent(
    broker: Broker, watcher: Watcher
):
    """Malformed JSON on `reach.task.chores` is a letter without a task: a replay without a
    payload is refused (409, saying to send one); with ``{"payload": ...}`` the page's API
    sends it on the letter's topic, in its trace, as `reach dlq replay --payload` does."""
    await dead_letter(
        broker,
        reason="invalid_envelope",
        message_id="torn-1",
        trace_id="torn-1",
        topic="chores",
        raw=b'{"text": ',
        error=ErrorInfo(type="invalid_envelope", message="JSON is malformed", retryable=False),
    )
    async with dashboard(broker) as server:
        ours = [f"Host: 127.0.0.1:{server.port}", "X-Reach-Request: 1", "Connection: close", BEARER]
        as_json = [*ours, "Content-Type: application/json"]
        replay = ("POST", "/api/dlq/torn-1/replay")
        refused = await send(server, *replay, ours)
        taken = await send(server, *replay, as_json, b'{"payload": {"text": "mended"}}')
        replayed = await watcher.event("replayed", message_id="torn-1")
    assert refused[0] == 409, refused
    assert '{"payload": ...}' in json.loads(refused[1])["error"]
    assert taken[0] == 202, taken
    sent = json.loads(taken[1])
    assert (sent["topic"], sent["trace_id"], sent["replay_of"]) == ("chores", "torn-1", "torn-1")
    assert replayed.detail["replayed_as"] == sent["message_id"]
    names = broker.names
    stored = await read_stream(broker, names.tasks_stream, names.task("chores"))
    assert [decode_task(m.data).payload for m in stored] == [{"text": "mended"}]
