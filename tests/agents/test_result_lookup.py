"""``ReachClient.result(id)``: a message sent earlier looked up by its id, nothing sent
(Celery's ``AsyncResult(id).get()``), through NATS and a coordinator."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from agentreach.agents import (
    Agent,
    DeadlineExceeded,
    InvalidArgument,
    PermanentError,
    ReachClient,
    TaskContext,
    TaskFailed,
)
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.broker.lifecycle import events_of_id
from agentreach.coordinator import Coordinator
from agentreach.envelopes import Budget
from tests.conftest import FAST
from tests.e2e.test_startup_and_restarts import RestartableServer
from tests.support import until_true


class Summary(msgspec.Struct):
    words: int


def _agent(release: asyncio.Event) -> Agent:
    agent = Agent("looked-up-1", startup_delay=0)

    @agent.handler("count")
    async def count(ctx: TaskContext, payload: Any) -> Any:
        return {"words": len(payload["text"].split())}

    @agent.handler("slow")
    async def slow(ctx: TaskContext, payload: Any) -> Any:
        await release.wait()
        return {"words": 0}

    @agent.handler("refuse")
    async def refuse(ctx: TaskContext, payload: Any) -> Any:
        raise PermanentError("no such document")

    return agent


async def test_a_published_message_s_result_is_looked_up_by_its_id(broker, coordinator, watcher):
    """Sent with publish, its result is read later by id, typed if asked, and as often as
    asked; a failed one raises as invoke would; one still running says so after the
    timeout and answers once it ends. Nothing is sent again: one `routed` each."""
    release = asyncio.Event()
    async with _agent(release).running(broker=broker), ReachClient(broker=broker) as client:
        done, _ = await client.publish("count", {"text": "three small words"})
        failing, _ = await client.publish("refuse", {})
        running, _ = await client.publish("slow", {}, budget=Budget(execute_ms=20_000))
        assert await client.result(done) == {"words": 3}
        assert await client.result(done, result_type=Summary) == Summary(words=3)
        with pytest.raises(TaskFailed) as failed:
            await client.result(failing)
        await watcher.event("accepted", message_id=running)
        with pytest.raises(DeadlineExceeded, match="did not end within 300 ms"):
            await client.result(running, timeout_s=0.3)
        release.set()
        assert await client.result(running) == {"words": 0}
    error = failed.value.error
    assert (error.type, error.message, error.retryable) == (
        "PermanentError",
        "no such document",
        False,
    )
    assert [watcher.count("routed", {m}) for m in (done, failing, running)] == [1, 1, 1]


async def test_an_unknown_id_or_another_caller_s_message_is_said_so(broker, coordinator):
    """An id nothing was sent under: no event of it (after the timeout); another caller's
    message: an InvalidArgument naming the id, not its result."""
    release = asyncio.Event()
    async with (
        _agent(release).running(broker=broker),
        ReachClient(broker=broker, name="alice") as alice,
        ReachClient(broker=broker, name="bob") as bob,
    ):
        with pytest.raises(DeadlineExceeded, match="no event of it is recorded"):
            await alice.result("never-sent-1", timeout_s=0.3)
        message_id, _ = await alice.publish("count", {"text": "one"})
        assert await alice.result(message_id) == {"words": 1}
        with pytest.raises(InvalidArgument, match="another caller's message"):
            await bob.result(message_id, timeout_s=1)


async def test_a_result_is_waited_for_through_a_server_restart(tmp_path) -> None:
    """The server goes away and comes back while `result` waits: it keeps reading until
    the message ends, within its own timeout (the TypeScript client gave up at its first
    unanswered read, and the task it reported failed completed: an outside trial)."""
    release = asyncio.Event()
    names = Names(prefix="lookedup")
    async with (
        RestartableServer(tmp_path / "nats") as server,
        Broker(server.url, names=names, name="coordinator", wait=True) as own,
    ):
        await provision(own, Topology.default(names))
        async with (
            Coordinator(own, FAST).running(),
            _agent(release).running(server.url, names=names),
            ReachClient(server.url, names=names) as client,
        ):
            running, _ = await client.publish("slow", {}, budget=Budget(execute_ms=60_000))
            await until_true(lambda: _accepted(own, running))
            waiting = asyncio.create_task(client.result(running, timeout_s=60))
            await server.stop()
            await server.start()
            release.set()
            assert await waiting == {"words": 0}


async def _accepted(broker: Broker, message_id: str) -> bool:
    return any(e.event == "accepted" for e in await events_of_id(broker, message_id))
