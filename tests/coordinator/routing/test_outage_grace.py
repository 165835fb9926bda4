"""A claim whose lease passed while the server was away still counts for a while after it
came back: the agent could not renew it, and records the outcome it kept once it reconnects."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import msgspec
from structlog.testing import capture_logs

from agentreach.agents import ReachClient
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.coordinator import Coordinator
from agentreach.envelopes import Execution, execution_key, now_ms
from tests.conftest import FAST
from tests.e2e.test_startup_and_restarts import RestartableServer, counting_agent
from tests.support import eventually, put_value


async def test_a_lease_that_passed_while_the_server_was_away_is_waited_for(tmp_path: Path):
    """The server went away and came back; agent x's claim of a task lapsed meanwhile (x
    had finished it just as the server died, and had not reconnected yet). The intake,
    which took the task in again (its acknowledgement lost with the server), routed it to
    another agent, which ran it a second time (a chaos run with kill -9 of the server). Now
    it waits for x's outcome, and answers from it: the other agent never runs the task."""
    runs = Counter[str]()
    async with RestartableServer(tmp_path / "nats") as server:
        url = server.url
        async with (
            Broker(url, names=Names(), name="coordinator", wait=True) as own,
            Coordinator(own, FAST).running(),
            counting_agent("after-outage", runs).running(url),
            ReachClient(url, name="alice") as alice,
        ):
            reconnects = own.reconnects
            await server.stop()
            await server.start()
            await eventually(lambda: own.reconnects > reconnects, 15)
            task = alice.task("count", {"n": 1}, ttl_ms=60_000)
            key, claim = _lapsed_claim(alice.caller, task.message_id)
            bucket = own.names.executions_bucket
            await put_value(own, bucket, key, msgspec.json.encode(claim))
            with capture_logs() as logs:
                invoked = alice.invoke_task(task)
                waiting = asyncio.ensure_future(invoked)
                await eventually(lambda: any("an agent runs it now" in e["event"] for e in logs))
            done = msgspec.structs.replace(claim, state="done", result={"n": "from x"})
            await put_value(own, bucket, key, msgspec.json.encode(done))
            assert await waiting == {"n": "from x"}
    assert runs[task.message_id] == 0


async def test_a_coordinator_started_just_after_an_outage_waits_for_a_lapsed_lease_too(
    tmp_path: Path,
):
    """A coordinator started as the server came back (its first connect found the server
    up) took agent x's lease, lapsed while the server was away, for a dead agent's, and
    ran x's finished step again on another agent before x had reconnected (a chaos run: 7
    workflow steps run twice). A replica just started cannot tell that the server was away
    a moment ago: it gives the same grace from its first connect."""
    runs = Counter[str]()
    async with (
        RestartableServer(tmp_path / "nats") as server,
        ReachClient(server.url, name="bob") as bob,
    ):
        await provision(bob.broker, Topology.default(bob.broker.names))
        task = bob.task("count", {"n": 1}, ttl_ms=60_000)
        key, claim = _lapsed_claim(bob.caller, task.message_id)
        bucket = bob.broker.names.executions_bucket
        await put_value(bob.broker, bucket, key, msgspec.json.encode(claim))
        async with (
            Broker(server.url, names=Names(), name="coordinator") as own,
            Coordinator(own, FAST).running(),
            counting_agent("fresh-after-outage", runs).running(server.url),
        ):
            with capture_logs() as logs:
                waiting = asyncio.ensure_future(bob.invoke_task(task))
                await eventually(lambda: any("an agent runs it now" in e["event"] for e in logs))
            done = msgspec.structs.replace(claim, state="done", result={"n": "from x"})
            await put_value(bob.broker, bucket, key, msgspec.json.encode(done))
            assert await waiting == {"n": "from x"}
    assert runs[task.message_id] == 0


def _lapsed_claim(caller: str, message_id: str) -> tuple[str, Execution]:
    """Agent x's claim of the message, its key and value, lapsed while the server was away."""
    claim = Execution(
        message_id=message_id,
        state="running",
        agent_id="x",
        caller=caller,
        lease_until_ms=now_ms() - 1_000,
    )
    return execution_key(caller, message_id, "x"), claim
