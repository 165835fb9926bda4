"""A server back on an empty store (its streams provisioned again) under a running
coordinator: the buckets' revisions start over, and the coordinator still follows the
agents' heartbeats and cards, on a real nats-server."""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, TaskContext
from agentreach.broker import Broker, EmbeddedServer, Names, Topology, provision
from agentreach.broker import watch as watch_module
from agentreach.coordinator import Coordinator
from agentreach.coordinator.liveness.config import LivenessConfig
from agentreach.envelopes import Heartbeat, Liveness
from tests.conftest import FAST
from tests.support import eventually, until_true

BEAT_S = 0.5
BEATS_AFTER = 8


async def _noop(ctx: TaskContext, payload: object) -> object:
    return payload


async def _seq(broker: Broker, agent_id: str) -> int:
    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    entry = await beats.get(agent_id)
    return entry.value.seq if entry is not None else 0


async def test_a_coordinator_follows_agents_through_a_server_back_on_an_empty_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the restart on an empty store the agent's beats (at revisions lower than
    before) keep it ONLINE, its verdict is written again, and its card `stopped` (it stops)
    reaches the routing. Both were missed
    until the new bucket passed the old one's last revision: the agent went SUSPECT, then
    OFFLINE while it beat, and a stopped agent was routed work."""
    monkeypatch.setattr(watch_module, "REMADE_CHECK_S", 0.3)
    names = Names(prefix="emptied")
    agent = Agent("stays-1", startup_delay=0, heartbeat_interval=BEAT_S)
    agent.handler("noop")(_noop)
    config = msgspec.structs.replace(FAST, liveness=LivenessConfig(tick_s=0.2))
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(EmbeddedServer(port=-1, store_dir=tmp_path / "a"))
        async with Broker(first.url, names=names) as admin:
            await provision(admin, Topology.default(names))
            for n in range(300):  # revisions the new buckets will not reach in this test
                for bucket in (names.heartbeats_bucket, names.agents_bucket):
                    await admin.publish(f"$KV.{bucket}.filler", b"%d" % n)
        second = EmbeddedServer(port=first.port, store_dir=tmp_path / "b")
        stack.push_async_callback(second.stop)  # after the coordinator and the agent
        own = await stack.enter_async_context(Broker(first.url, names=names, name="coordinator"))
        coordinator = await stack.enter_async_context(Coordinator(own, config).running())
        runtime = await stack.enter_async_context(agent.running(first.url, names=names))
        agents, cards = coordinator.liveness.agents, coordinator.directory.cards
        await eventually(lambda: "stays-1" in agents and agents["stays-1"].state == "ONLINE")
        await first.stop()
        await second.__aenter__()
        admin = await stack.enter_async_context(Broker(second.url, names=names))
        await provision(admin, Topology.default(names))
        # The agent back: its reconnect backoff may outlast SUSPECT's threshold here (1.5 s),
        # a silence of its own that this test is not about.
        await until_true(lambda: _seq_past(admin, 1))
        await eventually(lambda: agents["stays-1"].state == "ONLINE")
        with capture_logs() as logs:
            # Beats on the new store, well past SUSPECT's 3 silent intervals.
            back = await _seq(admin, "stays-1")
            await until_true(lambda: _seq_past(admin, back + BEATS_AFTER), timeout=20)
            state = agents["stays-1"].state
            moved = [e for e in logs if e["event"] == "liveness"]
            # Its verdict is in the new bucket (it read UNKNOWN there until a transition).
            verdict = await until_true(lambda: _verdict(admin), timeout=10)
            await runtime.stop()
            await eventually(lambda: cards["stays-1"].status == "stopped")
    assert state == "ONLINE" and moved == []  # never SUSPECT while it beat
    assert verdict.state == "ONLINE"


async def _seq_past(broker: Broker, seq: int) -> bool:
    return await _seq(broker, "stays-1") >= seq


async def _verdict(broker: Broker) -> Liveness | None:
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    entry = await verdicts.get("stays-1")
    return entry.value if entry is not None else None
