"""`reach agents forget ID`: retiring an agent that is gone for good."""

from __future__ import annotations

import asyncio
import contextlib

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker.streams import last_message
from agentreach.envelopes import AgentCard, Heartbeat, Liveness
from tests.cli.conftest import reach_argv, run
from tests.cli.test_reach_cli import worker
from tests.support import until_true, wait_for_card


async def reach(broker, *args: str):  # type: ignore[no-untyped-def]
    return await run(*reach_argv(broker, *args))


async def _records(broker, agent_id: str) -> list[object]:  # type: ignore[no-untyped-def]
    found = []
    for bucket, kind in (
        (broker.names.agents_bucket, AgentCard),
        (broker.names.heartbeats_bucket, Heartbeat),
        (broker.names.liveness_bucket, Liveness),
    ):
        found.append(await (await broker.bucket(bucket, kind)).get(agent_id))
    return found


async def test_forget_removes_a_gone_agent_for_good_and_it_can_register_again(
    broker, coordinator, watcher
):
    """A running agent is refused; once stopped, forget deletes its card, heartbeat and
    liveness, `reach agents` no longer lists it, the coordinator writes nothing back, and a
    new start of the same id registers and is judged ONLINE."""
    async with worker().running(broker=broker):
        await watcher.state("cli-reach-worker", "ONLINE")
        refused = await reach(broker, "agents", "forget", "cli-reach-worker")
    await watcher.state("cli-reach-worker", "OFFLINE")
    forgotten = await reach(broker, "agents", "forget", "cli-reach-worker")
    listed = await reach(broker, "agents")
    unknown = await reach(broker, "agents", "forget", "cli-reach-worker")
    coordinator_sweeps = [await coordinator.liveness.sweep() for _ in range(3)]
    gone = await _records(broker, "cli-reach-worker")
    async with worker().running(broker=broker):
        await wait_for_card(broker, "cli-reach-worker", status="running")
        back = await watcher.state("cli-reach-worker", "ONLINE", reason="heartbeat")
        again = await reach(broker, "agents")
    assert refused.returncode == 1 and "cli-reach-worker is ONLINE" in refused.stderr
    assert forgotten.returncode == 0, forgotten.stderr
    assert forgotten.stdout.startswith("cli-reach-worker: forgotten (was STOPPED)")
    assert "cli-reach-worker" not in listed.stdout
    assert unknown.returncode == 1 and "cli-reach-worker: unknown agent" in unknown.stderr
    assert coordinator_sweeps == [None] * 3 and gone == [None, None, None]
    assert back is not None
    row = next(line for line in again.stdout.splitlines() if line.startswith("cli-reach-worker"))
    assert row.split()[1] == "ONLINE"


async def test_a_draining_agent_is_listed_draining_and_cannot_be_forgotten(
    broker, coordinator, watcher
):
    """Stopping, its running handler finishing, the agent is DRAINING (it was STOPPED, and
    `forget` would have deleted the card of a live process)."""
    held, release = asyncio.Event(), asyncio.Event()
    agent = Agent("cli-drainer", startup_delay=0, drain_timeout=30)

    @agent.handler("cli-drain")
    async def hold(ctx: TaskContext, payload: object) -> object:
        held.set()
        await release.wait()
        return payload

    async with ReachClient(broker=broker) as client, contextlib.AsyncExitStack() as running:
        await running.enter_async_context(agent.running(broker=broker))
        await watcher.state("cli-drainer", "ONLINE")
        invoked = asyncio.create_task(client.invoke("cli-drain", {"n": 1}))
        await asyncio.wait_for(held.wait(), 10)
        stopping = asyncio.create_task(running.aclose())
        await wait_for_card(broker, "cli-drainer", status="draining")
        listed = await reach(broker, "agents")
        refused = await reach(broker, "agents", "forget", "cli-drainer")
        release.set()
        assert await asyncio.wait_for(invoked, 10) == {"n": 1}
        await asyncio.wait_for(stopping, 10)
    row = next(line for line in listed.stdout.splitlines() if line.startswith("cli-drainer"))
    assert row.split()[1] == "DRAINING"
    assert refused.returncode == 1 and "cli-drainer is ONLINE" in refused.stderr


async def test_reach_agents_reads_past_a_server_answer_written_over_a_verdict(
    broker, coordinator, watcher
):
    """Anyone may have the server write its answer to a request over an agent's liveness
    verdict: `reach agents` showed what it read (the agent UNKNOWN); it shows the last
    verdict the coordinator wrote, which the bucket keeps."""
    async with worker().running(broker=broker):
        await watcher.state("cli-reach-worker", "ONLINE")
        key = f"$KV.{broker.names.liveness_bucket}.cli-reach-worker"
        await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
        await until_true(lambda: _overwritten(broker, key))
        listed = await reach(broker, "agents")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("cli-reach-worker"))
    assert row.split()[1] == "ONLINE"


async def _overwritten(broker, subject: str) -> bool:  # type: ignore[no-untyped-def]
    stored = await last_message(broker, f"KV_{broker.names.liveness_bucket}", subject)
    return stored is not None and b"io.nats.jetstream.api" in stored.data
