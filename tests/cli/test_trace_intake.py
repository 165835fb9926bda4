"""`reach trace` of a task stored in the intake but not routed yet (no coordinator runs, or no
agent can take it now): no event of it is recorded, and the trace says where it waits and why
instead of "no events recorded", as the operator, and as the caller that sent it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agentreach.agents import Agent, TaskContext
from agentreach.broker import Broker, Topology, consumer_state, provision
from agentreach.broker.streams import stream_bounds
from agentreach.cli.trace import offset_shown
from agentreach.coordinator import Coordinator, QueueConfig
from agentreach.envelopes import headers as h
from tests.cli.conftest import Completed, reach_argv, reach_command, run
from tests.e2e.routing_support import fast
from tests.secured import SecuredDeployment, secured_server
from tests.support import Watcher, until_true

NOT_ROUTED = "not routed yet (topic {topic}, priority {priority}; {why})"
NO_COORDINATOR = "no coordinator runs: start `reach up` or `reach coordinator`"


async def test_trace_finds_a_task_stored_while_no_coordinator_runs(broker):
    """By its message id, its trace id, or a bare body's Nats-Msg-Id: the task is stored in
    the intake, not routed yet, because no coordinator runs; exit 0. An id nobody sent is
    still "no events recorded", exit 1."""
    published = await _reach(
        broker, "publish", "nowhere", "{}", "--message-id", "kept-1", "--trace-id", "kept-trace"
    )
    headers = {h.MSG_ID: "bare-1", h.PRIORITY: "P0"}
    await broker.publish(broker.names.task("nowhere"), b'{"n": 2}', headers=headers)
    by_id, by_trace = (
        await _reach(broker, "trace", "kept-1"),
        await _reach(broker, "trace", "kept-trace"),
    )
    bare, unknown = (
        await _reach(broker, "trace", "bare-1"),
        await _reach(broker, "trace", "sent-never"),
    )
    assert published.returncode == 0, published.stderr
    assert by_id.returncode == 0, by_id.stderr
    [line] = by_id.stdout.splitlines()
    assert line.startswith("kept-1: stored in the intake at "), line
    assert line.endswith(NOT_ROUTED.format(topic="nowhere", priority="P1", why=NO_COORDINATOR))
    assert by_trace.stdout == by_id.stdout
    assert bare.returncode == 0 and bare.stdout.startswith("bare-1: stored in the intake at ")
    assert "(topic nowhere, priority P0;" in bare.stdout
    assert unknown.returncode == 1 and not unknown.stdout  # said as every failure is
    assert unknown.stderr.startswith("reach: error: no events recorded for 'sent-never'")


async def test_a_task_waiting_for_an_agent_is_seen_by_its_caller_and_an_operator(
    deployment: SecuredDeployment, tmp_path: Path
):
    """Secured: the one agent's queue is full, so the caller's second task waits in the
    intake, held by the coordinator. Its caller (through the coordinator) and an operator
    read that it waits for an agent; another caller learns nothing of it."""
    config = fast(queues=QueueConfig(capacity={"P1": 1}, full_wait_s=60.0))
    gate = asyncio.Event()
    agent = Agent("one-slot", startup_delay=0)

    @agent.handler("one_slot", capacity=1)
    async def one_slot(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    async with (
        secured_server(deployment, tmp_path / "nats") as server,
        Broker(server.url, name="admin", auth=deployment.admin) as admin,
    ):
        await provision(admin, Topology.default(admin.names))
        party = _Parties(deployment, server.url)
        async with (
            Broker(server.url, name="coordinator", auth=deployment.coordinator) as own,
            Coordinator(own, config).running(),
            Watcher(admin) as watcher,
            agent.running(server.url, auth=deployment.auth("agent", "one-slot")),
        ):
            await party("caller", "alice", "publish", "one_slot", "{}", "--message-id", "first")
            await watcher.event("accepted", message_id="first")  # its one slot is taken
            await party("caller", "alice", "publish", "one_slot", "{}", "--message-id", "second")
            await until_true(lambda: _all_taken_in(admin))
            alice = await party("caller", "alice", "trace", "second")
            bob = await party("caller", "bob", "trace", "second")
            operator = await party("operator", "admin", "trace", "second")
            gate.set()
            await watcher.event("completed", message_id="second")
    waiting = NOT_ROUTED.format(
        topic="one_slot", priority="P1", why="waiting for an agent that can take it"
    )
    for seen in (alice, operator):
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.startswith("second: stored in the intake at "), seen.stdout
        assert seen.stdout.rstrip().endswith(waiting), seen.stdout
    assert bob.returncode == 1 and "among bob's own messages" in bob.stderr


async def _reach(broker: Broker, *args: str) -> Completed:
    return await run(*reach_argv(broker, *args))


async def _all_taken_in(broker: Broker) -> bool:
    """Whether the coordinator's intake has had every stored task delivered (once is enough:
    one it could not route now, it holds)."""
    names = broker.names
    intake = await consumer_state(broker, names.tasks_stream, names.coordinator_intake)
    _, last = await stream_bounds(broker, names.tasks_stream)
    return intake is not None and intake.delivered_seq >= last


class _Parties:
    """`reach ARGS` as one party of the deployment, with nothing but its creds file."""

    def __init__(self, deployment: SecuredDeployment, url: str) -> None:
        self._deployment, self._url = deployment, url

    async def __call__(self, role: str, name: str, *args: str) -> Completed:
        creds = self._deployment.auth(role, name).creds
        argv = [reach_command(), *args, "--nats-url", self._url, "--creds", str(creds)]
        return await run(*argv, env={**os.environ, "NATS_URL": "", "NATS_CREDS": ""})


def test_an_offset_stays_within_its_column_however_late_the_event():
    """Past 100 s, `+100000.0ms` pushed the rest of the line out of its columns."""
    assert offset_shown(0.0123) == "+12.3ms"
    assert offset_shown(9.9999) == "+9999.9ms"
    assert offset_shown(613.2071) == "+613.207s"
    assert offset_shown(93_725) == "+26h02m05s"
    assert all(len(offset_shown(s)) <= 10 for s in (0, 9.99, 10, 3599.999, 3600, 359_999))
